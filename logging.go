package outbox

import (
	"github.com/millrace/watermill-outbox/internal/warnlog"
)

// WarnLogger is implemented by a watermill.LoggerAdapter that has a warning
// level. Watermill's interface has none, so the outbox logs its warnings
// (a configuration that can stall a partition, for example) through Warn
// when the logger has it, and at Error level otherwise.
type WarnLogger = warnlog.Logger

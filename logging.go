package outbox

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill"
)

// WarnLogger is implemented by a watermill.LoggerAdapter that has a warning
// level. Watermill's interface has none, so the outbox logs its warnings
// (a configuration that can stall a partition, for example) through Warn
// when the logger has it, and at Error level otherwise.
type WarnLogger interface {
	Warn(msg string, fields watermill.LogFields)
}

// errWarning is the error logged with a warning on a logger without Warn.
var errWarning = errors.New("outbox: warning")

func warn(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) {
	if w, ok := logger.(WarnLogger); ok {
		w.Warn(msg, fields)
		return
	}
	logger.Error(msg, errWarning, fields)
}

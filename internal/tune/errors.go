package tune

import (
	"fmt"

	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// ErrInvalidConfig is matched by every [*ConfigError]: outbox.ErrInvalidConfig.
var ErrInvalidConfig = sentinel.ErrInvalidConfig

// ConfigError reports one invalid field: outboxtype.ConfigError.
type ConfigError = outboxtype.ConfigError

func configErrorf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

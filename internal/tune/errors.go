package tune

import (
	"fmt"

	"github.com/millrace/watermill-outbox/internal/errs"
)

// ErrInvalidConfig is matched by every [*ConfigError]: outbox.ErrInvalidConfig.
var ErrInvalidConfig = errs.ErrInvalidConfig

// ConfigError reports one invalid field: outboxtype.ConfigError.
type ConfigError = errs.ConfigError

func configErrorf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

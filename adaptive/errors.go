package adaptive

import (
	"github.com/millrace/watermill-outbox/internal/errs"

	"errors"
	"fmt"
)

// ErrInvalidConfig is matched (via errors.Is) by every [*ConfigError]. It is
// outbox.ErrInvalidConfig: one error for an impossible configuration,
// whichever package checks it.
var ErrInvalidConfig = errs.ErrInvalidConfig

// ErrUnknownProfile is matched (via errors.Is) by the error [Profile] returns
// for a name it does not know.
var ErrUnknownProfile = errors.New("adaptive: unknown tuning profile")

// ConfigError reports one invalid configuration field (Field, e.g.
// "BatchSize" or "LeaseTTL", and Reason: what is wrong and what
// is allowed). It matches [ErrInvalidConfig]. It is outbox.ConfigError.
type ConfigError = errs.ConfigError

func configErrorf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

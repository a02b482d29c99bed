package adaptive

import (
	"errors"
	"fmt"
)

// ErrInvalidConfig is matched (via errors.Is) by every [*ConfigError].
var ErrInvalidConfig = errors.New("adaptive: invalid configuration")

// ErrUnknownProfile is matched (via errors.Is) by the error [Profile] returns
// for a name it does not know.
var ErrUnknownProfile = errors.New("adaptive: unknown tuning profile")

// ConfigError reports one invalid configuration field. It matches
// [ErrInvalidConfig].
type ConfigError struct {
	// Field names the offending field, e.g. "BatchSize" or
	// "Pacing.IdleInterval".
	Field string
	// Reason says what is wrong and what is allowed.
	Reason string
}

// Error implements error.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid configuration: %s %s", e.Field, e.Reason)
}

// Is reports whether target is [ErrInvalidConfig].
func (e *ConfigError) Is(target error) bool {
	return target == ErrInvalidConfig
}

func configErrorf(field, format string, args ...any) *ConfigError {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

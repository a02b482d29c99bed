package adaptive

import (
	"errors"
	"fmt"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// ErrUnknownProfile is matched (via errors.Is) by the error [Profile] returns
// for a name it does not know.
var ErrUnknownProfile = errors.New("adaptive: unknown tuning profile")

// configErrorf reports one invalid configuration field as an
// *outboxtype.ConfigError (Field, e.g. "BatchSize" or "LeaseTTL", and
// Reason: what is wrong and what is allowed), which matches
// outbox.ErrInvalidConfig ([sentinel.ErrInvalidConfig]).
func configErrorf(field, format string, args ...any) *outboxtype.ConfigError {
	return &outboxtype.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

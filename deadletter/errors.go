package deadletter

import (
	"errors"
	"fmt"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Errors of the store besides the outbox's own, each matched with
// errors.Is. An id no entry has is outbox.ErrNotFound; an impossible
// argument of a call (an unknown status, a negative duration) is
// outbox.ErrInvalidArgument.
var (
	// ErrInvalidState: the entry's status does not allow the operation,
	// e.g. replaying an entry already replayed (*StateError).
	ErrInvalidState = errors.New("deadletter: invalid entry state")
	// ErrInvalidCursor: a List cursor was not produced by List with the
	// same order. It also matches outbox.ErrInvalidArgument.
	ErrInvalidCursor = fmt.Errorf("%w: invalid page cursor", sentinel.ErrInvalidArgument)
)

// StateError reports an operation refused because of the entry's status.
type StateError struct {
	ID     int64
	Op     string // "replay", "discard"
	Status Status // the entry's current status
}

func (e *StateError) Error() string {
	return fmt.Sprintf("deadletter: cannot %s entry %d: it is %s, not pending", e.Op, e.ID, e.Status)
}

// Is makes errors.Is(err, ErrInvalidState) true.
func (e *StateError) Is(target error) bool { return target == ErrInvalidState }

func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

package deadletter

import (
	"errors"
	"fmt"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// Errors of the store. Each can be matched with errors.Is.
var (
	// ErrNotFound: no entry has the given id. It is outbox.ErrNotFound.
	ErrNotFound = outboxtype.ErrNotFound
	// ErrInvalidState: the entry's status does not allow the operation,
	// e.g. replaying an entry already replayed (*StateError).
	ErrInvalidState = errors.New("deadletter: invalid entry state")
	// ErrInvalidArgument: an argument of a call is impossible, e.g. an
	// unknown status or a negative duration. It is
	// outbox.ErrInvalidArgument.
	ErrInvalidArgument = outboxtype.ErrInvalidArgument
	// ErrInvalidCursor: a List cursor was not produced by List with the
	// same order. It also matches ErrInvalidArgument.
	ErrInvalidCursor = fmt.Errorf("%w: invalid page cursor", ErrInvalidArgument)
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
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

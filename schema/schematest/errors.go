package schematest

import (
	"errors"
	"fmt"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// Errors of the StandIn's lifecycle. Each says what to do instead; match
// them with errors.Is. ErrNilStandIn, ErrAlreadyStarted and ErrClosed also
// match the library's outbox.ErrInvalidArgument, outbox.ErrAlreadyRunning
// and outbox.ErrClosed.
var (
	// ErrNilStandIn: a method was called on a nil *StandIn.
	ErrNilStandIn = fmt.Errorf("%w: schematest: nil *StandIn: make one with NewStandIn", sentinel.ErrInvalidArgument)
	// ErrNotStarted: Down or Up was called before Start.
	ErrNotStarted = errors.New("schematest: the stand-in was never started: call Start first")
	// ErrAlreadyStarted: Start was called twice; after Down, call Up.
	ErrAlreadyStarted = fmt.Errorf("%w: schematest: the stand-in was started already: after Down, call Up to listen again", sentinel.ErrAlreadyRunning)
	// ErrClosed: the stand-in was closed for good; make a new one with
	// NewStandIn.
	ErrClosed = fmt.Errorf("%w: schematest: the stand-in is closed: make a new one with NewStandIn", sentinel.ErrClosed)
	// ErrListen: the stand-in could not listen on the loopback address
	// (for Up: its address was taken by another listener while it was
	// down). The error wraps the network error.
	ErrListen = errors.New("schematest: cannot listen on the loopback address")
)

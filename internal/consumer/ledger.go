package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// ledger is the attempt ledger of a partition: the deliveries and failures
// of the message it counts them for — the head (cursor+1), or the message
// of the batch delivered last when it is further on. What it counts is
// also on the cursor row (deliveries, attempts, last_error), where the next
// holder of the lease finds it.
type ledger struct {
	seq int64
	// deliveries of seq, counted before each hand-out (this one included):
	// its attempt number (MetadataAttempt).
	deliveries int
	// charged is its failed deliveries recorded (cursors.attempts): nacks,
	// errors, timeouts, and crashes it caused alone. MaxAttempts counts
	// these.
	charged     int
	first, last time.Time // its first and last failure seen
	lastError   string    // its last failure recorded, for a dead letter
	maxAttempts int       // 0: never exhausted
}

// newLedger starts the ledger of the head at the cursor row's state.
func newLedger(head int64, charged int, lastError string, maxAttempts int) ledger {
	return ledger{seq: head, deliveries: charged, charged: charged, lastError: lastError, maxAttempts: maxAttempts}
}

// heldLedger is the ledger of held message seq of u, whose retry was just
// counted (deliveries): its failures are on its held row.
func heldLedger(u *heldUnit, seq int64, deliveries, maxAttempts int, now time.Time) ledger {
	l := ledger{seq: seq, deliveries: deliveries, charged: u.attempts, first: u.firstFailure, lastError: u.lastError, maxAttempts: maxAttempts}
	if l.first.IsZero() {
		l.first = now
	}
	return l
}

// counted takes the delivery count a read made for seq, the head.
func (l *ledger) counted(seq int64, deliveries int) {
	if l.seq != seq {
		l.follow(seq)
	}
	l.deliveries = deliveries
}

// attemptOf returns the attempt number of a delivery of the message at seq
// now being handed out: the head's deliveries were counted by the read; a
// later message of the batch is on its first, unless it is the one that
// failed last. It starts following a message further on.
func (l *ledger) attemptOf(seq int64) int {
	switch {
	case seq == l.seq:
		return max(l.deliveries, 1)
	case seq < l.seq:
		return 1
	}
	l.follow(seq)
	l.deliveries = 1
	return 1
}

// follow starts counting for seq, which has had no failure yet.
func (l *ledger) follow(seq int64) {
	*l = ledger{seq: seq, maxAttempts: l.maxAttempts}
}

// uncount takes back a counted delivery that did not happen.
func (l *ledger) uncount() {
	if l.deliveries > 0 {
		l.deliveries--
	}
}

// deadLettering notes that the followed held messages are dead-lettered
// now (the dead letters' last failure).
func (l *ledger) deadLettering(now time.Time) { l.last = now }

// nextUndelivered notes that the messages dead-lettered next were not
// delivered (after the first batch of a held key).
func (l *ledger) nextUndelivered() { l.deliveries = 0 }

// failed notes that a delivery failed now (for the dead letter's times).
func (l *ledger) failed(now time.Time) {
	if l.first.IsZero() {
		l.first = now
	}
	l.last = now
}

// recorded notes that a failed attempt was recorded on the cursor row.
func (l *ledger) recorded() { l.charged++ }

// exhausted reports whether a failure now would be the message's
// MaxAttempts-th.
func (l ledger) exhausted() bool {
	return l.maxAttempts > 0 && l.charged+1 >= l.maxAttempts
}

// used reports whether the message has failed MaxAttempts times already:
// it is taken out without another delivery.
func (l ledger) used() bool {
	return l.maxAttempts > 0 && l.charged >= l.maxAttempts
}

// failure is the text recorded for a failed attempt of the message (with
// reason), remembered for its dead letter.
func (l *ledger) failure(reason error) error {
	if reason == nil {
		reason = errors.New("nacked")
	}
	err := fmtErr(fmt.Errorf("seq %d, attempt %d: %w", l.seq, l.deliveries, reason))
	l.lastError = err.Error()
	return err
}

// poison is the reason of a rejection after MaxAttempts failures, the last
// one reason. It says how many deliveries there were, the number the dead
// letter's Attempts holds: more than the failures when a crash cut a
// delivery short while others were in flight in its process (counted as a
// delivery, not as a failure: docs/failure-modes.md §3).
func (l ledger) poison(reason error) error {
	if reason == nil {
		reason = errors.New("nacked")
	}
	failures := min(l.charged+1, l.maxAttempts)
	if deliveries := l.deliveries; deliveries > failures {
		return &exhaustedError{fmt.Errorf("%w: delivered %d times, failed %d times (MaxAttempts %d); the %d other deliveries were cut short by crashes of the consumer process while other deliveries were in flight, which count as no failure; last: %w",
			sentinel.ErrPoison, deliveries, failures, l.maxAttempts, deliveries-failures, reason)}
	}
	return &exhaustedError{fmt.Errorf("%w: failed %d times (MaxAttempts %d), last: %w", sentinel.ErrPoison, failures, l.maxAttempts, reason)}
}

// exhaustedError is the reason of a rejection after MaxAttempts failures,
// told apart from a handler's own ErrPoison (outbox.Reject), which names
// the message the handler rejects, not necessarily the head.
type exhaustedError struct{ err error }

func (e *exhaustedError) Error() string { return e.err.Error() }
func (e *exhaustedError) Unwrap() error { return e.err }

// isExhausted reports a reason made by poison.
func isExhausted(err error) bool { return errors.As(err, new(*exhaustedError)) }

// fmtErr keeps error text bounded for the cursor's last_error column.
func fmtErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if len(msg) > 2000 {
		return fmt.Errorf("%s…", msg[:2000])
	}
	return err
}

package consumer

import "time"

// progress is where a Worker stands in its partition: the state that every
// turn reads and changes. Only the methods in this file and the ledger's
// own (ledger.go) write it (progress_owner_test.go fails on a write
// anywhere else), so every way the cursor, the attempt ledger or the
// suspects can change is listed in those two files, each named by the
// event that changes it.
type progress struct {
	// cursor is the last seq done, as committed on the cursor row (the
	// scan position with key isolation: held and parked messages are at
	// or below it).
	cursor int64
	// ledger counts the deliveries and failures of the message the worker
	// follows: the head, a later message of the batch that failed, or a
	// held message being retried (borrow).
	ledger ledger
	// suspects are the messages to deliver alone (crash evidence).
	suspects span
}

// newProgress is where the worker starts: at the cursor row as the lease's
// acquisition left it.
func newProgress(l Lease, maxAttempts int) progress {
	from, to := l.Suspects()
	return progress{
		cursor:   l.Cursor(),
		ledger:   newLedger(l.Cursor()+1, l.Attempts(), l.LastError(), maxAttempts),
		suspects: span{from: from, to: to},
	}
}

// moved records a committed cursor move to seq.
func (p *progress) moved(seq int64) { p.cursor = seq }

// readLimit returns how many messages the next read may take, limit at
// most: one when the head is a suspect, fewer when a suspect comes before
// limit. Suspects the cursor has passed are forgotten.
func (p *progress) readLimit(limit int) int {
	head := p.cursor + 1
	if p.suspects.to > 0 && p.suspects.to < head {
		p.suspects = span{}
	}
	switch {
	case p.suspects.covers(head):
		return 1
	case p.suspects.to > 0 && p.suspects.from > head:
		return int(min(int64(limit), p.suspects.from-head))
	}
	return limit
}

// borrow makes the ledger follow held message seq of u, whose retry was
// just counted (deliveries), and returns the function that gives the
// scan's ledger back.
func (p *progress) borrow(u *heldUnit, seq int64, deliveries int) (restore func()) {
	saved := p.ledger
	p.ledger = heldLedger(u, seq, deliveries, saved.maxAttempts, time.Now())
	return func() { p.ledger = saved }
}

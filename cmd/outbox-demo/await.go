package main

import (
	"context"
	"fmt"
	"time"
)

// Bounds of the waits after publishing.
const (
	sequenceTimeout = 30 * time.Second
	deliverTimeout  = 60 * time.Second
	// settleTime is how long the consumers are given, once they have every
	// message, for copies still on their way, so that they are counted.
	settleTime = 300 * time.Millisecond
)

// awaitSequenced waits until no committed message is left unsequenced. All
// publishers are done, so whatever is still pending was committed.
func (d *demo) awaitSequenced(ctx context.Context) error {
	start := time.Now()
	for {
		var pending int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+table("pending")).Scan(&pending); err != nil {
			return err
		}
		if pending == 0 {
			break
		}
		if time.Since(start) > sequenceTimeout {
			return fmt.Errorf("%d committed message(s) still unsequenced after %s", pending, sequenceTimeout)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	st := d.sequencer.Stats()
	fmt.Fprintf(d.out, "   %d messages sequenced in %d passes; the last %s after publishing ended\n",
		st.Sequenced, st.Passes, time.Since(start).Round(time.Millisecond))
	return nil
}

// awaitDelivered waits until both brokers' consumers have received as many
// distinct messages as were committed, then a little longer for late
// copies, and stops the progress line. What arrived is checked later; when
// the wait times out, the check lists what is missing.
func (d *demo) awaitDelivered(ctx context.Context) error {
	start := time.Now()
	publishEnd := d.publishStart.Add(d.published.elapsed)
	want := d.published.counts.committedMsgs.Load()
	waits := []*brokerWait{
		{in: d.kafkaIn, fwd: d.forwarded.kafka},
		{in: d.natsIn, fwd: d.forwarded.nats},
	}
	for pending := len(waits); pending > 0; {
		for _, w := range waits {
			if !w.reached && w.in.unique.Load() >= want {
				w.reached, w.after = true, time.Since(publishEnd)
				pending--
			}
			if err := w.fwd.failed(); err != nil {
				return fmt.Errorf("the forwarder to %s stopped: %w", w.in.broker, err)
			}
		}
		if pending > 0 && time.Since(start) > deliverTimeout {
			d.stopProgress()
			for _, w := range waits {
				fmt.Fprintf(d.out, "   %s: %d of %d committed messages arrived within %s (forwarder's last error: %q)\n",
					w.in.broker, w.in.unique.Load(), want, deliverTimeout, w.fwd.Stats().LastError)
			}
			return nil
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	if err := sleep(ctx, settleTime); err != nil {
		return err
	}
	d.stopProgress()
	for _, w := range waits {
		fmt.Fprintf(d.out, "   %s's consumer had all %d committed messages %s after publishing ended\n",
			w.in.broker, want, w.after.Round(time.Millisecond))
	}
	return nil
}

// brokerWait follows one broker in awaitDelivered.
type brokerWait struct {
	in      *received
	fwd     *runningForwarder
	reached bool          // every committed message arrived
	after   time.Duration // when, since publishing ended
}

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

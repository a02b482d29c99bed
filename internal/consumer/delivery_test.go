package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/worker"
)

// The Leased strategy, one message at a time: what each answer of the
// handler leaves on the cursor row, and what the worker does next. The
// store and lease are the in-memory fakes (fakes_test.go); time is
// synctest's.

// Acked messages move the cursor once per batch, past all of them; a full
// batch asks for the next turn at once.
func TestAckedBatchMovesTheCursorOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "b", "c")
		r := newRig(t, s, func(c *Config, _ *fakeLease) { c.Tuning.BatchSize = 3 }, nil)
		dir, got, err := r.step(nil)
		if err != nil || !dir.Proceeds() {
			t.Fatalf("directive %v, err %v; want proceed (a full batch)", dir, err)
		}
		if !slices.Equal(uuids(got), []string{"m1", "m2", "m3"}) {
			t.Fatalf("handed out %v", uuids(got))
		}
		if c := s.State(); c.Seq != 3 || c.Attempts != 0 || c.InflightTo != 0 {
			t.Fatalf("cursor row %+v: want seq 3, nothing in flight", c)
		}
		if n := r.cfg.Counts.Acked.Load(); n != 3 {
			t.Fatalf("acked %d", n)
		}
	})
}

// A batch shorter than the batch size is all there is: the worker waits to
// be poked.
func TestShortBatchGoesIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, newFakeStore("a"), nil, nil)
		if dir, _, err := r.step(nil); err != nil || dir != worker.Idle() {
			t.Fatalf("directive %v, err %v; want idle", dir, err)
		}
		if dir, got, err := r.step(nil); err != nil || dir != worker.Idle() || len(got) != 0 {
			t.Fatalf("an empty log: directive %v, err %v, %d handed out", dir, err, len(got))
		}
	})
}

// Each message carries the outbox metadata: topic, partition, seq, attempt,
// stable id, incarnation, key.
func TestMessagesCarryTheOutboxMetadata(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore()
		s.Append(Entry{Key: "k1", Payload: []byte("x"), Metadata: map[string]string{"app": "v"}})
		r := newRig(t, s, nil, nil)
		_, got, _ := r.step(nil)
		m := got[0].Metadata
		want := map[string]string{MetadataTopic: "orders", MetadataPartition: "0", MetadataSeq: "1", MetadataAttempt: "1",
			MetadataID: "orders/0/1", MetadataIncarnation: "1", MetadataPartitionKey: "k1", "app": "v"}
		for k, v := range want {
			if m.Get(k) != v {
				t.Errorf("metadata %s = %q, want %q", k, m.Get(k), v)
			}
		}
		if !IsDelivered(got[0]) || IsDelivered(message.NewMessage("x", nil)) || IsDelivered(nil) {
			t.Fatal("IsDelivered does not tell the worker's messages")
		}
	})
}

// A nack: the done prefix moves the cursor, the failure is recorded on the
// next message with its backoff, and the worker sleeps it out.
func TestNackRecordsAFailedAttemptAndBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "bad", "c")
		r := newRig(t, s, nil, nil)
		dir, got, err := r.step(map[string]answer{"bad": nack})
		if err != nil {
			t.Fatal(err)
		}
		d, sleeping := dir.SleepDelay()
		if !sleeping || d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("directive %v: want a sleep of the first backoff, 50..100 ms with jitter", dir)
		}
		if len(got) != 2 {
			t.Fatalf("handed out %v: c must wait behind bad", uuids(got))
		}
		c := s.State()
		if c.Seq != 1 || c.Attempts != 1 || c.Backoff != d || !strings.HasPrefix(c.LastError, "seq 2, attempt 1: ") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// The retry is the message's second delivery, numbered so; when it succeeds
// the failure is cleared with the cursor move.
func TestRetryIsTheNextAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("bad", "b")
		r := newRig(t, s, nil, nil)
		r.step(map[string]answer{"bad": nack})
		_, got, _ := r.step(nil)
		if got[0].UUID != "m1" || got[0].Metadata.Get(MetadataAttempt) != "2" {
			t.Fatalf("retry: %s attempt %s, want m1 attempt 2", got[0].UUID, got[0].Metadata.Get(MetadataAttempt))
		}
		if c := s.State(); c.Seq != 2 || c.Attempts != 0 || c.LastError != "" {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// After MaxAttempts failures the message goes to the RejectHandler with
// its last error and attempts, the cursor moves past it, and the rejection
// is counted.
func TestMaxAttemptsTakesTheMessageOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("bad", "b")
		r := newRig(t, s, nil, nil)
		for range 3 {
			r.step(map[string]answer{"bad": nack})
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m1" || taken[0].Attempts != 3 || !errors.Is(taken[0].Reason, sentinel.ErrPoison) ||
			!strings.Contains(taken[0].Reason.Error(), "failed 3 times") {
			t.Fatalf("rejected %+v", taken)
		}
		if c := s.State(); c.Seq < 1 {
			t.Fatalf("cursor %d: not past the rejected message", c.Seq)
		}
		if n := r.cfg.Counts.Rejected.Load(); n != 1 {
			t.Fatalf("rejections counted: %d", n)
		}
	})
}

// outbox.Reject takes a message out at once, with its cause; the messages
// before it in the batch are done.
func TestRejectTakesTheMessageOutAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a", "poison", "c")
		r := newRig(t, s, nil, nil)
		cause := errors.New("cannot parse")
		dir, _, err := r.step(map[string]answer{"poison": func(m *message.Message) { _ = Reject(m, cause, nil); m.Nack() }})
		if err != nil || !dir.Proceeds() {
			t.Fatalf("directive %v, err %v", dir, err)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m2" || !errors.Is(taken[0].Reason, cause) || taken[0].Metadata[MetadataSeq] != "2" {
			t.Fatalf("rejected %+v", taken)
		}
		if c := s.State(); c.Seq != 2 {
			t.Fatalf("cursor %d, want 2 (past the rejected message)", c.Seq)
		}
	})
}

// RejectTo names the handler at the call site; without any RejectHandler,
// a rejected message is retried like a nacked one, never dropped.
func TestRejectToAndRejectWithoutAHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("poison")
		r := newRig(t, s, func(c *Config, _ *fakeLease) { c.RejectHandler, c.MaxAttempts = nil, 0 }, nil)
		r.step(map[string]answer{"poison": func(m *message.Message) { _ = Reject(m, errors.New("x"), nil); m.Ack() }})
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 {
			t.Fatalf("without a RejectHandler: cursor row %+v, want the message retried", c)
		}
		via := &rejects{}
		time.Sleep(time.Second) // the backoff
		r.step(map[string]answer{"poison": func(m *message.Message) { _ = Reject(m, errors.New("x"), via); m.Ack() }})
		if len(via.taken()) != 1 || s.State().Seq != 1 {
			t.Fatalf("RejectTo: %d taken, cursor %d", len(via.taken()), s.State().Seq)
		}
	})
}

// A RejectHandler that fails keeps the message in the stream: the failure
// is a counted attempt.
func TestFailingRejectHandlerKeepsTheMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("poison")
		r := newRig(t, s, nil, nil)
		r.rejects.fail = errors.New("dead-letter table full")
		dir, _, _ := r.step(map[string]answer{"poison": func(m *message.Message) { _ = Reject(m, errors.New("x"), nil); m.Ack() }})
		if _, sleeping := dir.SleepDelay(); !sleeping {
			t.Fatalf("directive %v: want a backoff", dir)
		}
		if c := s.State(); c.Seq != 0 || c.Attempts != 1 || !strings.Contains(c.LastError, "dead-letter table full") {
			t.Fatalf("cursor row %+v", c)
		}
	})
}

// A handler that does not answer within HandlerTimeout: the delivery is a
// counted attempt with ErrHandlerTimeout; its late Ack changes nothing.
func TestHandlerTimeoutIsACountedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("slow", "b")
		r := newRig(t, s, nil, nil)
		var held atomic.Pointer[message.Message] // set by the handler's goroutine
		start := time.Now()
		_, got, _ := r.step(map[string]answer{"slow": func(m *message.Message) { held.Store(m) }})
		if took := time.Since(start); took < r.cfg.HandlerTimeout {
			t.Fatalf("gave up after %v, before HandlerTimeout", took)
		}
		if len(got) != 1 || s.State().Attempts != 1 || !strings.Contains(s.State().LastError, "HandlerTimeout") {
			t.Fatalf("cursor row %+v", s.State())
		}
		held.Load().Ack() // late
		synctest.Wait()
		if c := s.State(); c.Seq != 0 || r.cfg.Counts.TimedOut.Load() != 1 {
			t.Fatalf("after the late ack: cursor row %+v, timeouts %d", c, r.cfg.Counts.TimedOut.Load())
		}
	})
}

// A message whose payload is missing is never handed out: each turn is a
// counted failure with ErrPayloadMissing, the messages before it are
// delivered, and after MaxAttempts it is dead-lettered.
func TestMissingPayloadFailsWithoutAHandOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		s.Append(Entry{PayloadMissing: true})
		s.Append(Entry{Payload: []byte("c")})
		r := newRig(t, s, nil, nil)
		var handed []string
		for range 5 { // m1; m2 fails twice, then its third failure takes it out; m3
			_, got, _ := r.step(nil)
			handed = append(handed, uuids(got)...)
			time.Sleep(time.Second)
		}
		if !slices.Equal(handed, []string{"m1", "m3"}) {
			t.Fatalf("handed out %v: want m1, then m3 after m2 is dead-lettered", handed)
		}
		taken := r.rejects.taken()
		if len(taken) != 1 || taken[0].UUID != "m2" || !errors.Is(taken[0].Reason, sentinel.ErrPayloadMissing) {
			t.Fatalf("rejected %+v", taken)
		}
	})
}

// The backoff left on the cursor row at acquisition is waited out before
// the first delivery.
func TestInitialBackoffIsWaitedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, newFakeStore("a"), func(_ *Config, l *fakeLease) { l.Found.Backoff = 3 * time.Second }, nil)
		dir, got, _ := r.step(nil)
		if d, ok := dir.SleepDelay(); !ok || d != 3*time.Second || len(got) != 0 {
			t.Fatalf("first turn: %v, %d handed out; want a 3 s sleep first", dir, len(got))
		}
		if _, got, _ := r.step(nil); len(got) != 1 {
			t.Fatal("the message was not delivered after the backoff")
		}
	})
}

// The lease ends while a handler holds a message: the worker waits
// CloseTimeout for the answer, then stops, and its stop takes the delivery
// back (no crash to settle for the next holder).
func TestLeaseEndingMidDeliveryTakesTheDeliveryBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("held")
		r := newRig(t, s, nil, nil)
		go func() {
			time.Sleep(10 * time.Millisecond)
			r.lease.Cancel(errors.New("rebalanced"))
		}()
		dir, got, err := r.step(map[string]answer{"held": hold})
		if err != nil || dir != worker.Idle() || len(got) != 1 {
			t.Fatalf("directive %v, err %v, %d handed out", dir, err, len(got))
		}
		if c := s.State(); c.InflightTo != 1 {
			t.Fatalf("before the stop: in flight to %d, want the delivery recorded", c.InflightTo)
		}
		r.w.Stop()
		if c := s.State(); c.InflightTo != 0 || c.Attempts != 0 || c.Deliveries != 0 {
			t.Fatalf("after the stop: cursor row %+v, want the delivery taken back", c)
		}
	})
}

// A lease that ends before the first message reached a handler (nobody
// took it from the channel) takes its delivery back in the turn itself,
// not only when the worker stops: the message was never delivered.
func TestLeaseEndingBeforeTheHandOutTakesTheDeliveryBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("never handed out")
		r := newRig(t, s, nil, nil)
		r.unstopped = true // what the turn itself leaves
		go func() {
			time.Sleep(10 * time.Millisecond) // the worker waits on the channel, unread
			r.lease.Cancel(errors.New("rebalanced"))
		}()
		dir, err := r.w.Step(r.lease.Context())
		if err != nil || dir != worker.Idle() {
			t.Fatalf("directive %v, err %v; want idle", dir, err)
		}
		if c := s.State(); c.InflightTo != 0 || c.Deliveries != 0 || c.Attempts != 0 {
			t.Fatalf("cursor row %+v: want the delivery taken back by the turn", c)
		}
	})
}

// A lost lease ends the turn with lease.ErrLeaseLost: nothing is written.
func TestLostLeaseEndsTheTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		r := newRig(t, s, nil, nil)
		r.lease.Lose()
		if _, err := r.w.Step(context.Background()); !leaseEnded(err) {
			t.Fatalf("err %v, want the lease lost", err)
		}
	})
}

// A dead letter's Attempts is the message's deliveries, and its reason
// tells the same number: a delivery a crash cut short while other
// deliveries were in flight counts as a delivery but not as a failure, so
// with MaxAttempts 3 such a message is taken out after 4 deliveries, 3 of
// them failed (issue 39: attempts 4 beside a reason that said "failed 3
// times").
func TestDeadLetterAttemptsAgreeWithItsReason(t *testing.T) {
	for _, tc := range []struct {
		name       string
		crashed    int64 // deliveries cut short by a crash with others in flight, charged to nobody
		batch      bool
		attempts   int
		reasonSays string
	}{
		{"three failures", 0, false, 3, "failed 3 times (MaxAttempts 3)"},
		{"a crash and three failures", 1, false, 4, "delivered 4 times, failed 3 times (MaxAttempts 3); the 1 other deliveries"},
		{"a crash and three failures of a batch handler", 1, true, 4, "delivered 4 times, failed 3 times (MaxAttempts 3); the 1 other deliveries"},
		{"two crashes and three failures", 2, false, 5, "delivered 5 times, failed 3 times (MaxAttempts 3); the 2 other deliveries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newFakeStore("bad", "b")
				s.Cursor.Deliveries = tc.crashed // what the acquisition left of the crash
				var batch BatchHandler
				if tc.batch {
					batch = func(_ context.Context, msgs []*message.Message) (int, error) {
						for i, m := range msgs {
							if string(m.Payload) == "bad" {
								return i, errors.New("boom")
							}
						}
						return len(msgs), nil
					}
				}
				r := newRig(t, s, nil, batch)
				for range 3 {
					r.step(map[string]answer{"bad": nack})
				}
				taken := r.rejects.taken()
				if len(taken) != 1 {
					t.Fatalf("rejected %+v, want m1", taken)
				}
				got := taken[0]
				if got.Attempts != tc.attempts || !strings.Contains(got.Reason.Error(), tc.reasonSays) {
					t.Fatalf("dead letter: attempts %d, reason %q; want attempts %d and a reason saying %q", got.Attempts, got.Reason, tc.attempts, tc.reasonSays)
				}
				if !strings.Contains(got.Reason.Error(), fmt.Sprintf("%d times", got.Attempts)) {
					t.Fatalf("the reason %q does not tell the attempts (%d)", got.Reason, got.Attempts)
				}
			})
		})
	}
}

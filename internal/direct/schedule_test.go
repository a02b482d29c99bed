package direct_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/origin"
	"github.com/millrace/watermill-outbox/internal/sim"
	"github.com/millrace/watermill-outbox/internal/tune"
)

// recordingTarget takes every round whole and notes when each came and
// what it carried.
type recordingTarget struct {
	mu     sync.Mutex
	rounds []sentRound
}

type sentRound struct {
	at   time.Duration // since the test's start
	uuid []string
}

var start time.Time

// countingStore notes when the loop reads pending.
type countingStore struct {
	direct.Store
	mu    sync.Mutex
	reads []time.Duration
}

func (c *countingStore) ReadPending(ctx context.Context, topic string, partitions []int32, limit int, now time.Time) ([]direct.Row, error) {
	c.mu.Lock()
	c.reads = append(c.reads, time.Since(start))
	c.mu.Unlock()
	return c.Store.ReadPending(ctx, topic, partitions, limit, now)
}

func (c *countingStore) since(t time.Duration) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Duration
	for _, r := range c.reads {
		if r > t {
			out = append(out, r-t)
		}
	}
	return out
}

func (r *recordingTarget) Reconcile(context.Context, origin.Origin, string, int64) ([]direct.Held, error) {
	return nil, nil
}

func (r *recordingTarget) SendRound(_ context.Context, _ string, batches []*direct.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var uuids []string
	for _, b := range batches {
		for _, m := range b.Messages {
			uuids = append(uuids, m.UUID)
		}
		b.Done = len(b.Messages)
	}
	r.rounds = append(r.rounds, sentRound{time.Since(start), uuids})
}

func (r *recordingTarget) sent() []sentRound {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sentRound(nil), r.rounds...)
}

// The rounds follow the load, found by the loop itself (publishers notify
// at most every 10 ms): after a round that forwarded messages the next
// starts max(FollowLoad(Pace, n), Pace/FollowUpShare) after it, so a
// message committed meanwhile goes then and not sooner; after a round that
// found nothing the loop looks again at the busy pace, then at twice that,
// up to Poll. On the simulator's database model and a fake clock: exact.
func TestRoundsFollowTheLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start = time.Now()
		model := sim.NewDBModel("g", time.Now)
		target := &recordingTarget{}
		store := &countingStore{Store: model.Pending()}
		const pace = 20 * time.Millisecond
		loop := direct.New(direct.Config{
			Store: store, Schema: "s", Group: "g", Topic: "orders", Partitions: 1, TargetTopic: "orders",
			Target: target, Lease: lease.Config{Store: model.Lease(), MemberID: "m", TTL: time.Minute},
			BatchSize: 10, Pace: pace, Poll: time.Second,
		})
		model.InsertPending(0, "m1", "k").Commit(model)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- loop.Run(ctx) }()
		// The lease comes with the manager's first balance.
		for i := 0; i < 5000 && len(target.sent()) == 0; i++ {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		first := target.sent()
		if len(first) != 1 || len(first[0].uuid) != 1 || first[0].uuid[0] != "m1" {
			t.Fatalf("first rounds %+v, want m1 alone at once", first)
		}
		t0 := first[0].at
		followUp := max(tune.FollowLoad(pace, 1), pace/direct.FollowUpShare)
		time.Sleep(followUp / 2)
		model.InsertPending(0, "m2", "k").Commit(model)
		time.Sleep(followUp/2 - time.Nanosecond)
		synctest.Wait()
		if n := len(target.sent()); n != 1 {
			t.Fatalf("%d rounds before the follow-up was due, want 1", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		got := target.sent()
		if len(got) != 2 || got[1].uuid[0] != "m2" || got[1].at-t0 != followUp {
			t.Fatalf("rounds %+v: want m2 sent %v after the first round", got, followUp)
		}
		// Nothing more: the loop looks again after the busy pace and then
		// at twice the interval, and sends nothing.
		time.Sleep(8 * pace)
		synctest.Wait()
		if n := len(target.sent()); n != 2 {
			t.Fatalf("%d rounds, want 2: an empty look sends nothing", n)
		}
		tm2 := got[1].at
		want := []time.Duration{followUp, followUp + pace, followUp + 3*pace, followUp + 7*pace}
		if looks := store.since(tm2); len(looks) < len(want) || !slices.Equal(looks[:len(want)], want) {
			t.Fatalf("looks after the last round at %v, want %v", looks, want)
		}
		// A message after a quiet spell is found by the next look, at most
		// Poll later.
		model.InsertPending(0, "m3", "k").Commit(model)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := target.sent(); len(got) != 3 || got[2].uuid[0] != "m3" {
			t.Fatalf("rounds %+v: want m3 found within Poll", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if c := loop.Stats(); c.Messages != 3 || c.Rounds != 3 {
			t.Fatalf("stats %+v, want 3 messages in 3 rounds", c)
		}
	})
}

// A publisher's notification starts a round no sooner than the pace after
// the last one; the log-based relay's (names.RelayedPayload) starts one
// at once: its own pace made the batch, and the forwarder's on top would
// only add latency.
func TestARelayNotificationStartsARoundAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start = time.Now()
		model := sim.NewDBModel("g", time.Now)
		target := &recordingTarget{}
		const pace = 80 * time.Millisecond
		for i := range 11 {
			model.InsertPending(0, "a"+strconv.Itoa(i), "k").Commit(model)
		}
		loop := runLoop(t, model, model.Pending(), target, direct.Config{Partitions: 1, BatchSize: 100, Pace: pace, Poll: time.Minute})
		for i := 0; i < 5000 && len(target.sent()) == 0; i++ {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		first := target.sent()
		if len(first) != 1 || len(first[0].uuid) != 11 {
			t.Fatalf("first rounds %+v, want the 11 messages in one", first)
		}
		gap := tune.FollowLoad(pace, 11)
		if gap < 5*time.Millisecond {
			t.Fatalf("the pace after 11 messages is %v: the test needs a longer one", gap)
		}
		time.Sleep(time.Millisecond)
		model.InsertPending(0, "b", "k").Commit(model)
		loop.Notified("")
		synctest.Wait()
		if n := len(target.sent()); n != 1 {
			t.Fatalf("%d rounds right after a publisher's notification, want none before the pace (%v)", n-1, gap)
		}
		loop.Notified(names.RelayedPayload)
		synctest.Wait()
		got := target.sent()
		if len(got) != 2 || got[1].uuid[0] != "b" || got[1].at-first[0].at != time.Millisecond {
			t.Fatalf("rounds %+v: want b sent at once on the relay's notification, 1ms after the first round", got)
		}
	})
}

// An idle loop's poll doubles from Poll up to MaxIdlePoll while its
// notifications are trusted (its LISTEN is live), stays at Poll when they
// are not, and falls back to Poll once a look at the idle pace finds a
// message no notification announced, until a notified round finds work
// again: the sequencer's rule (tune.IdlePoll), so that a quiet topic costs
// a read per MaxIdlePoll and a missed notification costs at most that.
func TestAnIdleLoopStretchesItsPollWhileNotificationsAreTrusted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start = time.Now()
		model := sim.NewDBModel("g", time.Now)
		target := &recordingTarget{}
		store := &countingStore{Store: model.Pending()}
		const poll, maxIdle = 100 * time.Millisecond, 800 * time.Millisecond
		loop := runLoop(t, model, store, target, direct.Config{Partitions: 1, BatchSize: 10, Pace: 10 * time.Millisecond, Poll: poll, MaxIdlePoll: maxIdle})
		var mu sync.Mutex
		live := true
		loop.SetLive(func() bool { mu.Lock(); defer mu.Unlock(); return live })
		// gaps returns the waits between the reads of the last span.
		gaps := func(span time.Duration) []time.Duration {
			from := time.Since(start)
			time.Sleep(span)
			synctest.Wait()
			reads := store.since(from)
			var out []time.Duration
			for i := 1; i < len(reads); i++ {
				out = append(out, reads[i]-reads[i-1])
			}
			return out
		}
		settled := func(what string, got []time.Duration, want time.Duration) {
			t.Helper()
			if len(got) < 2 || got[len(got)-1] != want || got[len(got)-2] != want {
				t.Fatalf("%s: waits between reads %v, want them to settle at %v", what, got, want)
			}
			for _, g := range got {
				if g > want {
					t.Fatalf("%s: waits between reads %v, one over %v", what, got, want)
				}
			}
		}
		settled("listening, nothing to do", gaps(6*time.Second), maxIdle)

		mu.Lock()
		live = false // the LISTEN connection dropped
		mu.Unlock()
		settled("not listening", gaps(time.Second), poll)

		mu.Lock()
		live = true
		mu.Unlock()
		settled("listening again", gaps(6*time.Second), maxIdle)

		// A message without a notification: found by the idle look, after
		// which the loop no longer trusts the notifications.
		model.InsertPending(0, "unannounced", "k").Commit(model)
		time.Sleep(maxIdle)
		synctest.Wait()
		if got := target.sent(); len(got) != 1 || got[0].uuid[0] != "unannounced" {
			t.Fatalf("rounds %+v: want the unannounced message found within MaxIdlePoll", got)
		}
		settled("after an unannounced find", gaps(3*time.Second), poll)

		// A notified round that finds work trusts them again.
		model.InsertPending(0, "announced", "k").Commit(model)
		loop.Notified("")
		synctest.Wait()
		if got := target.sent(); len(got) != 2 || got[1].uuid[0] != "announced" {
			t.Fatalf("rounds %+v: want the announced message sent on its notification", got)
		}
		settled("after an announced find", gaps(6*time.Second), maxIdle)
	})
}

// runLoop runs a loop of one member (an hour's lease) on model's leases,
// store and target, of cfg (its Config's fields for the test), until the
// test's bubble ends.
func runLoop(t *testing.T, model *sim.DBModel, store direct.Store, target direct.Target, cfg direct.Config) *direct.Loop {
	t.Helper()
	cfg.Store, cfg.Target = store, target
	cfg.Schema, cfg.Group, cfg.Topic, cfg.TargetTopic = "s", "g", "orders", "orders"
	cfg.Lease = lease.Config{Store: model.Lease(), MemberID: "m", TTL: time.Hour}
	loop := direct.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return loop
}

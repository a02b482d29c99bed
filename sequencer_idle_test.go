package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// waitUntil polls cond until it holds (the test's timeout bounds it).
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() {
		if outboxtest.Ctx(t).Err() != nil {
			t.Fatal("the condition never held")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// publishSingle publishes one message on topic, notifying the sequencer or
// not.
func publishSingle(t *testing.T, e env, topic string, notify bool) {
	t.Helper()
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true, DisableNotify: !notify}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, message.NewMessage("m", nil)); err != nil {
		t.Fatal(err)
	}
}

// runSequencer runs a sequencer of e's schema until the test ends.
func runSequencer(t *testing.T, cfg outbox.SequencerConfig) *outbox.Sequencer {
	t.Helper()
	s, err := outbox.NewSequencer(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = s.Close()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

// An idle sequencer that listens on a live connection stretches its
// safety-net poll up to MaxIdlePoll. A message whose transaction sent no
// NOTIFY is still found by the poll; after that the poll stays at
// PollInterval (the notifications cannot be trusted to announce work).
func TestSequencerIdlePollStretchesUntilAPollFindsUnannouncedWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("stretch", 2)
	const poll, maxIdle = 5 * time.Millisecond, 80 * time.Millisecond
	s := runSequencer(t, outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: poll, MaxIdlePoll: maxIdle, MinPassInterval: time.Millisecond})
	waitUntil(t, func() bool { return s.Stats().IdlePoll == maxIdle })

	publishSingle(t, e, "stretch", false) // no NOTIFY: only the poll finds it
	waitUntil(t, func() bool { return s.Stats().Sequenced == 1 })
	// From the pass's 1 ms on, doubling would pass 80 ms within 7 looks;
	// capped, it stays at the 5 ms PollInterval.
	looks := outbox.SequencerLooks(s)
	waitUntil(t, func() bool { return outbox.SequencerLooks(s) >= looks+10 })
	if got := s.Stats().IdlePoll; got > poll {
		t.Fatalf("after a poll found a message no notification announced, the poll stretched to %v, want at most PollInterval %v", got, poll)
	}
}

// A sequencer that does not listen (DisableListen) never stretches its
// poll: nothing would announce new work.
func TestSequencerWithoutListenKeepsItsPollInterval(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("nolisten", 1)
	const poll = 5 * time.Millisecond
	s := runSequencer(t, outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: poll, MaxIdlePoll: time.Hour, DisableListen: true})
	waitUntil(t, func() bool { return outbox.SequencerLooks(s) >= 12 }) // doubling from 5 ms would be past 10 s
	if got := s.Stats().IdlePoll; got != poll {
		t.Fatalf("a sequencer without LISTEN waits %v between looks, want PollInterval %v", got, poll)
	}
	publishSingle(t, e, "nolisten", true)
	waitUntil(t, func() bool { return s.Stats().Sequenced == 1 }) // found by the poll
}

// When the LISTEN connection drops, nothing stalls: the reconnect asks
// every subscriber to re-poll, so a message committed without a
// notification is sequenced although the poll is an hour away.
func TestSequencerFindsWorkWhenItsListenConnectionDrops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("drop", 1)
	s := runSequencer(t, outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour, MaxIdlePoll: 2 * time.Hour})
	waitForListener(t, e, e.Schema+"_pending")
	waitUntil(t, func() bool { return outbox.SequencerLooks(s) >= 1 }) // idle: the first look found nothing
	publishSingle(t, e, "drop", false)
	var killed int
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = $1`, `LISTEN "`+e.Schema+`_pending"`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listening backends, want 1", killed)
	}
	waitUntil(t, func() bool { return s.Stats().Sequenced == 1 })
}

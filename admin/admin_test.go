package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestConfigAndArgumentValidation(t *testing.T) {
	e := newEnv(t)
	if _, err := admin.New(admin.Config{}, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no pool: %v", err)
	}
	if _, err := admin.New(admin.Config{Pool: e.Pool, Schema: "A"}, nil); !errors.Is(err, outbox.ErrInvalidName) {
		t.Fatalf("bad schema: %v", err)
	}
	ctx := outboxtest.Ctx(t)
	for _, s := range []admin.Scope{{}, {Group: "g", Partitions: []int{1}}, {Group: "g", Topic: "t", Partitions: []int{-1}}} {
		if _, err := e.admin.Pause(ctx, s); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("Pause(%+v): %v", s, err)
		}
	}
	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "g", Topic: "bad topic"}); !errors.Is(err, outbox.ErrInvalidName) {
		t.Errorf("bad topic: %v", err)
	}
	if _, err := e.admin.Pause(ctx, admin.Scope{Group: "nobody"}); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("unknown group: %v", err)
	}
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "g"}, admin.ToSeq(0)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("reset without topic: %v", err)
	}
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "g", Topic: "t"}, admin.ToSeq(-1)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("negative seq: %v", err)
	}
	if _, err := e.admin.ResetCursor(ctx, admin.Scope{Group: "g", Topic: "t"}, admin.ToTime(time.Time{})); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Errorf("zero time: %v", err)
	}
}

// A scripted state, set up directly in the tables; every figure of the
// status must match it.
func TestStatusMatchesTheTruth(t *testing.T) {
	e := newEnv(t)
	ctx := outboxtest.Ctx(t)
	e.Register("a", 3)
	e.Register("b", 1)
	e.Register("idle", 2)
	e.PublishN("a", 30, "a") // 10 per partition
	e.PublishN("b", 4, "b")
	e.SequenceAll()
	e.PublishN("a", 5, "late") // not sequenced
	s := e.Schema
	e.Exec(`INSERT INTO ` + s + `.cursors (group_name, topic, partition, seq) VALUES
		('g1', 'a', 0, 10), ('g1', 'a', 1, 4), ('g1', 'a', 2, 0),
		('g2', 'a', 0, 10), ('g2', 'a', 1, 10), ('g2', 'a', 2, 7),
		('g1', 'b', 0, 1)`)
	e.Exec(`UPDATE ` + s + `.log SET sequenced_at = now() - interval '5 minutes' WHERE topic = 'a' AND partition = 1 AND seq = 5`)
	e.Exec(`UPDATE ` + s + `.log SET sequenced_at = now() - interval '1 hour' WHERE topic = 'a' AND partition = 2 AND seq = 1`)
	e.Exec(`UPDATE ` + s + `.cursors SET lease_owner = 'm-1', lease_token = 3, lease_expires_at = now() + interval '1 minute',
		adaptive_state = 'degraded', batch_size = 4, attempts = 2, last_error = 'boom', last_error_at = now()
		WHERE group_name = 'g1' AND topic = 'a' AND partition = 1`)
	e.Exec(`UPDATE ` + s + `.cursors SET lease_owner = 'm-2', lease_token = 1, lease_expires_at = now() - interval '1 minute'
		WHERE group_name = 'g1' AND topic = 'a' AND partition = 2`)
	e.Exec(`UPDATE ` + s + `.cursors SET paused = true WHERE group_name = 'g2' AND topic = 'a' AND partition = 2`)
	e.Exec(`DELETE FROM ` + s + `.log WHERE topic = 'a' AND partition = 0 AND seq <= 3`) // vacuumed
	store, err := deadletter.NewStore(deadletter.Config{Schema: s, Pool: e.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range []outboxtype.RejectedMessage{
		{Group: "g1", Topic: "a", Partition: 1, Seq: 2, UUID: "x"},
		{Group: "g1", Topic: "a", Partition: 1, Seq: 3, UUID: "y"},
		{Group: "g1", Topic: "a", Partition: 1, Seq: 1, UUID: "z"}, // discarded below
		{Group: "g1", Topic: "a", UUID: "external"},                // no partition
		{Group: "g2", Topic: "a", Partition: 2, Seq: 5, UUID: "w"},
	} {
		if _, err := store.Add(ctx, m); err != nil {
			t.Fatal(i, err)
		}
	}
	page, err := store.List(ctx, deadletter.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Discard(ctx, page.Entries[2].ID); err != nil {
		t.Fatal(err)
	}

	rep, err := e.admin.Status(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var topics []string
	for _, tp := range rep.Topics {
		topics = append(topics, tp.Topic)
	}
	if fmt.Sprint(topics) != "[a b idle]" {
		t.Fatalf("topics %v", topics)
	}
	a, b, idle := rep.Topics[0], rep.Topics[1], rep.Topics[2]
	if a.Partitions != 3 || a.Sequenced != 30 || a.Unsequenced != 5 || len(a.Groups) != 2 || a.Groups[0].Group != "g1" || a.Groups[1].Group != "g2" {
		t.Fatalf("topic a: %+v", a)
	}
	if b.Sequenced != 4 || len(b.Groups) != 1 || idle.Sequenced != 0 || idle.Partitions != 2 || len(idle.Groups) != 0 {
		t.Fatalf("topics b %+v, idle %+v", b, idle)
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 60 }

	g1 := a.Groups[0]
	// Lag: the partitions' 6 + 10, and the topic's 5 unsequenced.
	if g1.Lag != 21 || !near(g1.MaxLagSeconds, 3600) || g1.Leased != 1 || g1.Paused != 0 || g1.Failing != 1 || g1.DeadLetters != 2 || len(g1.Partitions) != 3 {
		t.Fatalf("g1 on a: %+v", g1)
	}
	p0, p1, p2 := g1.Partitions[0], g1.Partitions[1], g1.Partitions[2]
	if p0.Partition != 0 || p0.HeadSeq != 10 || p0.Cursor != 10 || p0.Lag != 0 || p0.LagSeconds != 0 || p0.OldestUnprocessedAt != nil ||
		p0.FirstRetainedSeq != 4 || p0.Leased || p0.LeaseOwner != "" || p0.AdaptiveState != "normal" || p0.BatchSize != 0 {
		t.Fatalf("g1 a/0: %+v", p0)
	}
	if p1.HeadSeq != 10 || p1.Cursor != 4 || p1.Lag != 6 || !near(p1.LagSeconds, 300) || p1.LagAge() < 4*time.Minute ||
		!p1.Leased || p1.LeaseOwner != "m-1" || p1.LeaseToken != 3 || p1.LeaseExpiresAt == nil || !p1.LeaseExpiresAt.After(rep.At) ||
		p1.AdaptiveState != "degraded" || p1.BatchSize != 4 || p1.Attempts != 2 || p1.LastError != "boom" || p1.LastErrorAt == nil ||
		p1.DeadLetters != 2 || p1.FirstRetainedSeq != 1 {
		t.Fatalf("g1 a/1: %+v", p1)
	}
	if p2.Cursor != 0 || p2.Lag != 10 || !near(p2.LagSeconds, 3600) || p2.Leased || p2.LeaseOwner != "m-2" || p2.DeadLetters != 0 {
		t.Fatalf("g1 a/2: %+v", p2)
	}
	g2 := a.Groups[1]
	if g2.Lag != 3+5 || g2.Paused != 1 || !g2.Partitions[2].Paused || g2.Partitions[2].Lag != 3 || g2.DeadLetters != 1 || g2.Leased != 0 {
		t.Fatalf("g2 on a: %+v", g2)
	}
	if bp := b.Groups[0].Partitions[0]; bp.Group != "g1" || bp.Topic != "b" || bp.HeadSeq != 4 || bp.Cursor != 1 || bp.Lag != 3 || bp.LagSeconds > 60 {
		t.Fatalf("g1 on b: %+v", bp)
	}

	// Filters.
	rep, err = e.admin.Status(ctx, admin.Filter{Group: "g2"})
	if err != nil || len(rep.Topics) != 1 || rep.Topics[0].Topic != "a" || len(rep.Topics[0].Groups) != 1 || rep.Topics[0].Groups[0].Group != "g2" {
		t.Fatalf("group g2 only: %+v, %v", rep, err)
	}
	rep, err = e.admin.Status(ctx, admin.Filter{Topic: "b"})
	if err != nil || len(rep.Topics) != 1 || rep.Topics[0].Topic != "b" {
		t.Fatalf("topic b only: %+v, %v", rep, err)
	}
	// Plain JSON.
	js, err := json.Marshal(rep)
	if err != nil || !strings.Contains(string(js), `"head_seq":4`) || !strings.Contains(string(js), `"lag":3`) {
		t.Fatalf("json %s, %v", js, err)
	}
}

// Pause stops delivery from a partition within the lease manager's balance
// interval while the others flow on; resume continues from the right seq.
func TestPauseAndResumeWithALiveSubscriber(t *testing.T) {
	e := newEnv(t)
	e.Register("p", 2)
	e.PublishN("p", 20, "first") // 10 per partition
	e.SequenceAll()
	sub := e.subscriber(t, "g")
	msgs, err := sub.Subscribe(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	wg := rec.run(msgs)
	outboxtest.WaitFor(t, "the first 20 messages", 30*time.Second, func() bool { return rec.count() >= 20 })
	outboxtest.WaitFor(t, "both cursors at 10", 30*time.Second, func() bool {
		s0, _, _ := e.Cursor("g", "p", 0)
		s1, _, _ := e.Cursor("g", "p", 1)
		return s0 == 10 && s1 == 10
	})

	n, err := e.admin.Pause(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "p", Partitions: []int{0}})
	if err != nil || n != 1 {
		t.Fatalf("pause: %d, %v", n, err)
	}
	took := outboxtest.WaitFor(t, "the paused partition's lease to be given back", 30*time.Second, func() bool {
		_, owner, _ := e.Cursor("g", "p", 0)
		return owner == ""
	})
	t.Logf("lease given back %v after the pause (balance interval %v)", took, lease.DefaultBalanceInterval)
	mark := rec.count()

	e.PublishN("p", 20, "second") // 10 more per partition
	e.SequenceAll()
	outboxtest.WaitFor(t, "partition 1's new messages", 30*time.Second, func() bool { return len(rec.seqs(1, mark)) >= 10 })
	// Partition 1 got its messages; partition 0, which would have been as
	// fast, stays quiet for several more balance intervals.
	time.Sleep(3 * lease.DefaultBalanceInterval)
	if got := rec.seqs(0, mark); len(got) != 0 {
		t.Fatalf("paused partition delivered %v", got)
	}
	if seq, owner, _ := e.Cursor("g", "p", 0); seq != 10 || owner != "" {
		t.Fatalf("paused partition: cursor %d, owner %q", seq, owner)
	}
	rep, err := e.admin.Status(outboxtest.Ctx(t), admin.Filter{Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if g := rep.Topics[0].Groups[0]; g.Paused != 1 || !g.Partitions[0].Paused || g.Partitions[0].Leased || g.Partitions[0].Lag != 10 || g.Partitions[1].Paused {
		t.Fatalf("status while paused: %+v", g)
	}

	n, err = e.admin.Resume(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "p", Partitions: []int{0}})
	if err != nil || n != 1 {
		t.Fatalf("resume: %d, %v", n, err)
	}
	outboxtest.WaitFor(t, "partition 0's messages after resume", 30*time.Second, func() bool { return len(rec.seqs(0, mark)) >= 10 })
	if got := rec.seqs(0, mark); fmt.Sprint(got[:10]) != fmt.Sprint(seqRange(11, 20)) {
		t.Fatalf("after resume partition 0 delivered %v, want 11..20", got)
	}

	// The whole group.
	if n, err := e.admin.Pause(outboxtest.Ctx(t), admin.Scope{Group: "g"}); err != nil || n != 2 {
		t.Fatalf("pause group: %d, %v", n, err)
	}
	outboxtest.WaitFor(t, "every lease given back", 30*time.Second, func() bool {
		_, o0, _ := e.Cursor("g", "p", 0)
		_, o1, _ := e.Cursor("g", "p", 1)
		return o0 == "" && o1 == ""
	})
	mark = rec.count()
	e.PublishN("p", 4, "third")
	e.SequenceAll()
	if n, err := e.admin.Resume(outboxtest.Ctx(t), admin.Scope{Group: "g"}); err != nil || n != 2 {
		t.Fatalf("resume group: %d, %v", n, err)
	}
	outboxtest.WaitFor(t, "the messages published while the group was paused", 30*time.Second, func() bool {
		return len(rec.seqs(0, mark)) >= 2 && len(rec.seqs(1, mark)) >= 2
	})
	if got := rec.seqs(0, mark); got[0] != 21 {
		t.Fatalf("after resuming the group partition 0 delivered %v first, want 21", got)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// ResetCursor to a seq and to a time replays, and revokes the lease of the
// worker in the middle of a batch, whose later cursor write must fail.
func TestResetCursorReplaysAndFencesTheRunningWorker(t *testing.T) {
	e := newEnv(t)
	e.Register("r", 1)
	e.PublishN("r", 10, "one")
	e.SequenceAll()
	var mid time.Time
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), `SELECT clock_timestamp()`).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	e.PublishN("r", 10, "two")
	e.SequenceAll()

	sub := e.subscriber(t, "g")
	msgs, err := sub.Subscribe(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	// The handler holds seq 5 (first delivery) unacked: the worker is in the
	// middle of its batch, the cursor still at 0.
	rec := &recorder{held: make(chan *message.Message, 1)}
	holding := true
	rec.hold = func(d delivery) bool {
		if holding && d.seq == 5 {
			holding = false
			return true
		}
		return false
	}
	wg := rec.run(msgs)
	held := <-rec.held
	_, _, token := e.Cursor("g", "r", 0)

	resets, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "r"}, admin.ToSeq(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 1 || resets[0] != (admin.CursorReset{Topic: "r", Partition: 0, From: 0, To: 2}) {
		t.Fatalf("resets %+v", resets)
	}
	seq, owner, newToken := e.Cursor("g", "r", 0)
	if seq != 2 || owner != "" || newToken != token+1 {
		t.Fatalf("after reset: cursor %d, owner %q, token %d (was %d)", seq, owner, newToken, token)
	}
	mark := rec.count()
	held.Ack() // the old worker finishes its message and tries to move the cursor
	// Until it notices the lost lease, the old worker may go on with its
	// batch (6, 7, ...); then the new holder starts at 3: the old worker's
	// cursor write (it had done 5 or more) was refused.
	fromThree := func() []int64 {
		replay := rec.seqs(0, mark)
		for i, s := range replay {
			if s == 3 {
				return replay[i:]
			}
		}
		return nil
	}
	outboxtest.WaitFor(t, "the replay from seq 3 to the end", 30*time.Second, func() bool { return len(fromThree()) >= 18 })
	if got := fromThree(); fmt.Sprint(got) != fmt.Sprint(seqRange(3, 20)) {
		t.Fatalf("deliveries after the reset %v: want 3..20 after the old worker's leftovers", rec.seqs(0, mark))
	}
	outboxtest.WaitFor(t, "the cursor at the end", 30*time.Second, func() bool { s, _, _ := e.Cursor("g", "r", 0); return s == 20 })

	// To a time: the messages sequenced at or after it, the second ten.
	mark = rec.count()
	resets, err = e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "r", Partitions: []int{0}}, admin.ToTime(mid))
	if err != nil || len(resets) != 1 || resets[0].From != 20 || resets[0].To != 10 {
		t.Fatalf("reset to time: %+v, %v", resets, err)
	}
	outboxtest.WaitFor(t, "the replay of the second ten", 30*time.Second, func() bool { return len(rec.seqs(0, mark)) >= 10 })
	if got := rec.seqs(0, mark); fmt.Sprint(got[:10]) != fmt.Sprint(seqRange(11, 20)) {
		t.Fatalf("after the reset to a time: %v", got)
	}
	// A time after everything: the head (nothing to replay).
	resets, err = e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "r"}, admin.ToTime(time.Now().Add(time.Hour)))
	if err != nil || resets[0].To != 20 {
		t.Fatalf("reset to the future: %+v, %v", resets, err)
	}

	// Refused resets change nothing.
	var rangeErr *admin.SeqRangeError
	if _, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "r"}, admin.ToSeq(21)); !errors.As(err, &rangeErr) ||
		!errors.Is(err, admin.ErrSeqOutOfRange) || rangeErr.Head != 20 {
		t.Fatalf("beyond the head: %v", err)
	}
	if _, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "g", Topic: "r", Partitions: []int{0, 1}}, admin.ToSeq(0)); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("a partition the topic lacks: %v", err)
	}
	if _, err := e.admin.ResetCursor(outboxtest.Ctx(t), admin.Scope{Group: "other", Topic: "r"}, admin.ToSeq(0)); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("unknown group: %v", err)
	}
	outboxtest.WaitFor(t, "the cursor at the end", 30*time.Second, func() bool { s, _, _ := e.Cursor("g", "r", 0); return s == 20 })
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

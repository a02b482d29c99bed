package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// notificationsDuring counts the notifications on channel while fn runs:
// after fn, the test sends a marker of its own and counts what came before
// it, so that late deliveries are counted too.
func notificationsDuring(t *testing.T, e env, channel string, fn func()) int {
	t.Helper()
	conn, err := e.Pool.Acquire(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	c := conn.Hijack()
	defer c.Close(context.Background())
	if _, err := c.Exec(outboxtest.Ctx(t), "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	fn()
	if _, err := e.Pool.Exec(outboxtest.Ctx(t), "SELECT pg_notify($1, 'marker')", channel); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		note, err := c.WaitForNotification(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if note.Payload == "marker" {
			return n
		}
		n++
	}
}

func publishOneTxEach(t *testing.T, e env, pub *outbox.Publisher, topic string, n int, gap time.Duration) {
	t.Helper()
	for i := range n {
		err := pgx.BeginFunc(outboxtest.Ctx(t), e.Pool, func(tx pgx.Tx) error {
			m := message.NewMessage(fmt.Sprintf("m%d", i), []byte("p"))
			m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
			return pub.Publish(topic, m)
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
	}
}

func TestNotifyIntervalSpacesThePublishersNotifications(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     int
	}{
		// Far beyond the test: only the first transaction notifies.
		{"one per hour", time.Hour, 1},
		{"every publish", -1, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("n", 4)
			got := notificationsDuring(t, e, e.Schema+"_pending", func() {
				// Two Publishers share the process-wide spacing.
				for range 2 {
					pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, NotifyInterval: tc.interval}, nil)
					if err != nil {
						t.Fatal(err)
					}
					publishOneTxEach(t, e, pub, "n", 15, 0)
				}
			})
			if got != tc.want {
				t.Fatalf("%d notifications for 30 transactions, want %d", got, tc.want)
			}
			if n := e.Rows("pending"); n != 30 {
				t.Fatalf("%d pending messages, want 30", n)
			}
		})
	}
}

func TestSequencerFindsMessagesWhoseTransactionDidNotNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("quiet", 2)
	// Neither the poll (an hour) nor a notification (one per hour) can find
	// the second message in time: only the follow-up passes after the first.
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour, MinPassInterval: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()
	waitForListener(t, e, e.Schema+"_pending")
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, NotifyInterval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := notificationsDuring(t, e, e.Schema+"_pending", func() {
		publishOneTxEach(t, e, pub, "quiet", 1, 0)
		outboxtest.WaitFor(t, "the first message sequenced", 30*time.Second, func() bool { return s.Stats().Sequenced == 1 })
		publishOneTxEach(t, e, pub, "quiet", 1, 0)
	})
	if got != 1 {
		t.Fatalf("%d notifications, want 1 (the second transaction must not notify)", got)
	}
	outboxtest.WaitFor(t, "the second message sequenced", 30*time.Second, func() bool { return s.Stats().Sequenced == 2 })
}

// The sequencer's pace follows the load (tune.FollowLoad): after a pass
// of one message a notification may start the next pass after 1/20 of
// MinPassInterval; after a pass of 39 messages or more, not before
// MinPassInterval from its start, and the messages committed meanwhile go
// in one pass. (Before, every pass waited MinPassInterval.)
func TestSequencerPaceFollowsTheLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("busy", 4)
	const gap = 400 * time.Millisecond
	s, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema, Pool: e.Pool, PollInterval: time.Hour, MinPassInterval: gap}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.Run(context.Background())
	defer s.Close()
	waitForListener(t, e, e.Schema+"_pending")
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, NotifyInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Light: one message, one pass, the short pace.
	publishOneTxEach(t, e, pub, "busy", 1, 0)
	outboxtest.WaitFor(t, "the first message sequenced", 30*time.Second, func() bool { return s.Stats().Sequenced == 1 })
	if got, want := s.Stats().Pace, gap/20; got != want {
		t.Fatalf("pace after a pass of one message %v, want %v", got, want)
	}

	// Heavy: 200 messages in one transaction, one pass, the busy pace.
	publishInOneTx(t, e, pub, "busy", 200)
	committed := time.Now()
	outboxtest.WaitFor(t, "the 200 sequenced", 30*time.Second, func() bool { return s.Stats().Sequenced == 201 })
	if st := s.Stats(); st.Pace != gap || st.Passes != 2 {
		t.Fatalf("after a pass of 200 messages: pace %v, %d passes; want %v and 2", st.Pace, st.Passes, gap)
	}
	// Notified at once, the next pass still starts gap after the last
	// one's start (which was after the commit): a lower bound, which a
	// slow machine only makes later.
	publishOneTxEach(t, e, pub, "busy", 3, 0)
	outboxtest.WaitFor(t, "the next 3 sequenced", 30*time.Second, func() bool { return s.Stats().Sequenced == 204 })
	if waited := time.Since(committed); waited < gap {
		t.Fatalf("the pass after a busy one came %v after its messages' commit, want at least the pace %v", waited, gap)
	}
	rows := e.readLog(t, "busy")
	if len(rows) != 204 {
		t.Fatalf("%d rows in the log, want 204", len(rows))
	}
}

// publishInOneTx publishes n messages of topic in one transaction.
func publishInOneTx(t *testing.T, e env, pub *outbox.Publisher, topic string, n int) {
	t.Helper()
	err := pgx.BeginFunc(outboxtest.Ctx(t), e.Pool, func(tx pgx.Tx) error {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("bulk-%d", i), []byte("p"))
			msgs[i].SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
		}
		return pub.Publish(topic, msgs...)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// recordCursorCommitMode installs a trigger that records the
// synchronous_commit setting of every transaction that moves a cursor.
func recordCursorCommitMode(t *testing.T, e env) func() map[string]int {
	t.Helper()
	stmts := []string{
		"CREATE TABLE " + e.Schema + ".cursor_commit_modes (mode text NOT NULL)",
		`CREATE FUNCTION ` + e.Schema + `.record_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO ` + e.Schema + `.cursor_commit_modes VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$`,
		`CREATE TRIGGER record_commit_mode AFTER UPDATE ON ` + e.Schema + `.cursors FOR EACH ROW
		WHEN (OLD.seq IS DISTINCT FROM NEW.seq) EXECUTE FUNCTION ` + e.Schema + `.record_commit_mode()`,
	}
	for _, s := range stmts {
		if _, err := e.Pool.Exec(outboxtest.Ctx(t), s); err != nil {
			t.Fatal(err)
		}
	}
	return func() map[string]int {
		rows, err := e.Pool.Query(outboxtest.Ctx(t), "SELECT mode, count(*) FROM "+e.Schema+".cursor_commit_modes GROUP BY mode")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var mode string
			var n int
			if err := rows.Scan(&mode, &n); err != nil {
				t.Fatal(err)
			}
			out[mode] = n
		}
		return out
	}
}

func TestCursorCommitDurabilityPerStrategy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tune func(*outbox.SubscriberConfig)
		want string
	}{
		{"leased relaxed by default", nil, "off"},
		{"leased with SyncCursorCommits", func(c *outbox.SubscriberConfig) { c.Advanced.SyncCursorCommits = true }, "on"},
		{"transactional", func(c *outbox.SubscriberConfig) { c.Strategy = outbox.Transactional }, "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.Register("d", 2)
			modes := recordCursorCommitMode(t, e)
			uuids := publishKeyed(t, e, "d", 4, 50)
			// The test cluster runs with synchronous_commit off; the
			// subscriber's sessions start with it on, as on a durable server.
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
			pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			sub := newSub(t, env{e.WithPool(pool)}, "g", tc.tune)
			defer sub.Close()
			h := &handled{}
			wg := consume(context.Background(), t, sub, "d", "one", h, 0)
			outboxtest.WaitFor(t, "all messages", time.Minute, func() bool { return h.distinct() == len(uuids) })
			var got map[string]int
			outboxtest.WaitFor(t, "cursor writes", 30*time.Second, func() bool { got = modes(); return len(got) > 0 })
			if len(got) != 1 || got[tc.want] == 0 {
				t.Fatalf("cursor moves committed with synchronous_commit %v, want all %q", got, tc.want)
			}
			_ = sub.Close()
			wg.Wait()
		})
	}
}

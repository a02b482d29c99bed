package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/relay"
)

// publishSingles publishes n one-message transactions into topic, one
// every gap, each with its own key, numbered from first.
func publishSingles(t *testing.T, pub *outbox.Publisher, topic string, first, n int, gap time.Duration) {
	t.Helper()
	for i := first; i < first+n; i++ {
		m := message.NewMessage(watermillUUID(i), []byte("x"))
		m.Metadata.Set(outbox.PartitionKeyMetadata, fmt.Sprintf("key-%d", i))
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
	}
}

func watermillUUID(i int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", i) }

// A stream of small commits is appended in steps of MinAppendInterval,
// each taking every commit decoded meanwhile, instead of one append per
// commit (which costs every partition it touches a read, a cursor move
// and a send). An append starts no sooner than MinAppendInterval after the
// previous one started, so over the time the test watched (from the first
// commit to the last one in the log) there are at most 1 + that time /
// MinAppendInterval of them, however slow the machine. Without a floor a
// commit that finds the relay idle is appended at once, alone: commits
// published one after the other's append take one append each.
func TestBusyRelayAppendsInPacedSteps(t *testing.T) {
	const commits = 60
	t.Run("paced", func(t *testing.T) {
		const pace = 300 * time.Millisecond
		b := setup(t, "orders", 4)
		r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = pace }, nil)
		start := time.Now()
		publishSingles(t, walPublisher(t, b), "orders", 0, commits, 20*time.Millisecond)
		waitLog(t, b, "orders", commits)
		watched := time.Since(start)
		st := r.Stats()
		if st.Transactions != commits {
			t.Fatalf("Transactions = %d, want %d", st.Transactions, commits)
		}
		most := 1 + int64(watched/pace)
		t.Logf("%d commits 20 ms apart, %v from the first to the last appended: %d appends (at most %d)", commits, watched.Round(time.Millisecond), st.Appends, most)
		if st.Appends > most {
			t.Fatalf("%d appends in %v with a MinAppendInterval of %v, want at most %d", st.Appends, watched, pace, most)
		}
	})
	t.Run("no floor", func(t *testing.T) {
		b := setup(t, "orders", 4)
		r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = -1 }, nil)
		pub := walPublisher(t, b)
		for i := range commits {
			publishSingles(t, pub, "orders", i, 1, 0)
			waitLog(t, b, "orders", int64(i+1))
		}
		if st := r.Stats(); st.Transactions != commits || st.Appends != commits {
			t.Fatalf("%d commits, each published once the one before was appended: %d transactions in %d appends, want one append each", commits, st.Transactions, st.Appends)
		}
	})
}

// The pace never delays a commit after an idle stretch: it is appended at
// once. The next one, within MinAppendInterval of that append, waits for
// the interval to end. Neither check depends on the machine's speed: with
// an interval of an hour the first commit would wait that long if the
// pace held it; the second cannot be appended sooner than the interval
// after the first append, which began after the test's clock started.
func TestIdleRelayAppendsTheFirstCommitAtOnce(t *testing.T) {
	t.Run("at once", func(t *testing.T) {
		b := setup(t, "orders", 2)
		startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = time.Hour }, nil)
		publishSingles(t, walPublisher(t, b), "orders", 0, 1, 0)
		waitLog(t, b, "orders", 1) // within a minute: not held for the hour
	})
	t.Run("the next waits", func(t *testing.T) {
		const pace = 3 * time.Second
		b := setup(t, "orders", 2)
		startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = pace }, nil)
		pub := walPublisher(t, b)
		start := time.Now()
		publishSingles(t, pub, "orders", 0, 1, 0)
		waitLog(t, b, "orders", 1)
		publishSingles(t, pub, "orders", 1, 1, 0)
		waitLog(t, b, "orders", 2)
		if took := time.Since(start); took < pace {
			t.Fatalf("the second commit was appended %v after the first commit, within the pace %v", took, pace)
		}
	})
}

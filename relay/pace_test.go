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
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, fmt.Sprintf("key-%d", i))
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(gap)
	}
}

func watermillUUID(i int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", i) }

// The relay's pace follows the load (tune.FollowLoad): after an append of
// one message the next may start 1/20 of MinAppendInterval after it; after
// an append of 39 messages or more, not before MinAppendInterval, and
// what is committed meanwhile goes in one append — instead of one append
// per commit (which costs every partition it touches a read, a cursor
// move and a send). Without a floor a commit that finds the relay idle is
// appended at once, alone: commits published one after the other's
// append take one append each.
func TestRelayPaceFollowsTheLoad(t *testing.T) {
	const commits = 60
	t.Run("paced", func(t *testing.T) {
		const pace = 400 * time.Millisecond
		b := setup(t, "orders", 4)
		r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = pace }, nil)
		pub := walPublisher(t, b)
		publishSingles(t, pub, "orders", 0, 1, 0)
		waitLog(t, b, "orders", 1)
		if got := r.Stats().Pace; got != pace/20 {
			t.Fatalf("pace after an append of one message %v, want %v", got, pace/20)
		}
		bulk := make([]*message.Message, 200)
		for i := range bulk {
			bulk[i] = message.NewMessage(watermillUUID(1000+i), []byte("x"))
		}
		if err := pub.Publish("orders", bulk...); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		waitLog(t, b, "orders", 201)
		if st := r.Stats(); st.Pace != pace || st.Appends != 2 {
			t.Fatalf("after an append of 200 messages: pace %v, %d appends; want %v and 2", st.Pace, st.Appends, pace)
		}
		// The commits right after a busy append wait for its pace: a lower
		// bound on the time, which a slow machine only makes later.
		publishSingles(t, pub, "orders", 1, commits, 0)
		waitLog(t, b, "orders", 201+commits)
		if waited := time.Since(committed); waited < pace {
			t.Fatalf("the append after a busy one came %v after its messages' commit, want at least the pace %v", waited, pace)
		}
		if st := r.Stats(); st.Transactions != commits+2 {
			t.Fatalf("%d transactions appended, want %d", st.Transactions, commits+2)
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
		if st := r.Stats(); st.Transactions != commits || st.Appends != commits || st.Pace != 0 {
			t.Fatalf("%d commits, each published once the one before was appended: %d transactions in %d appends (pace %v), want one append each", commits, st.Transactions, st.Appends, st.Pace)
		}
	})
}

// The pace never delays a commit after an idle stretch: it is appended at
// once. The next one, within the light pace (MinAppendInterval/20) of that
// append, waits for it to end. Neither check depends on the machine's
// speed: with an interval of an hour the first commit would wait that long
// if the pace held it; the second cannot be appended sooner than the light
// pace after the first append, which began after the test's clock started.
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
		if took := time.Since(start); took < pace/20 {
			t.Fatalf("the second commit was appended %v after the first commit, within the light pace %v", took, pace/20)
		}
	})
}

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
// every gap, each with its own key.
func publishSingles(t *testing.T, pub *outbox.Publisher, topic string, n int, gap time.Duration) {
	t.Helper()
	for i := range n {
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
// and a send). Without a floor the same stream takes many more appends.
func TestBusyRelayAppendsInPacedSteps(t *testing.T) {
	const commits = 60
	for _, tc := range []struct {
		name  string
		pace  time.Duration
		check func(appends int64) bool
		want  string
	}{
		{"paced", 300 * time.Millisecond, func(a int64) bool { return a <= 8 }, "at most 8 (about 1.2 s of commits in 300 ms steps)"},
		{"no floor", -1, func(a int64) bool { return a >= 20 }, "at least 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, "orders", 4)
			r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = tc.pace }, nil)
			publishSingles(t, walPublisher(t, b), "orders", commits, 20*time.Millisecond)
			waitLog(t, b, "orders", commits)
			st := r.Stats()
			if st.Transactions != commits {
				t.Fatalf("Transactions = %d, want %d", st.Transactions, commits)
			}
			t.Logf("%d commits 20 ms apart: %d appends", commits, st.Appends)
			if !tc.check(st.Appends) {
				t.Fatalf("%d commits 20 ms apart took %d appends, want %s", commits, st.Appends, tc.want)
			}
		})
	}
}

// The pace never delays a commit after an idle stretch: it is appended at
// once. The next one, within MinAppendInterval of that append, waits for
// the interval to end.
func TestIdleRelayAppendsTheFirstCommitAtOnce(t *testing.T) {
	const pace = 3 * time.Second
	b := setup(t, "orders", 2)
	startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.MinAppendInterval = pace }, nil)
	pub := walPublisher(t, b)
	time.Sleep(500 * time.Millisecond) // the relay streams, idle

	start := time.Now()
	publishSingles(t, pub, "orders", 1, 0)
	waitLog(t, b, "orders", 1)
	if took := time.Since(start); took >= pace/2 {
		t.Fatalf("the first commit after an idle stretch took %v to be appended, want well under the pace %v", took, pace)
	}
	publishSingles(t, pub, "orders", 1, 0)
	time.Sleep(pace / 3)
	if got := b.Int("SELECT count(*) FROM " + b.Schema + ".log"); got != 1 {
		t.Fatalf("the log holds %d messages %v after the first append, want 1: the second commit must wait for the pace", got, time.Since(start))
	}
	waitLog(t, b, "orders", 2)
	if took := time.Since(start); took < pace*9/10 {
		t.Fatalf("the second commit was appended %v after the first, within the pace %v", took, pace)
	}
}

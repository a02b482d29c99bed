package jetstream_test

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Two databases number their messages alike (same topic, partition and
// seqs: the same outbox_id): forwarded as named sources, the stream keeps
// both sources' messages, while a copy of one source's message within the
// duplicate window is still dropped.
func TestJetStreamKeepsTwoSourcesMessagesWithTheSameIDs(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	url := s.ClientURL()
	const stream = "orders"
	createStream(t, url, stream, 0)
	target := newJetStreamTarget(t, url)
	send := func(source string) {
		t.Helper()
		msgs := fwdtest.OutboxBatch(3, fwdtest.SameKey)
		for i, m := range msgs {
			m.Metadata.Set(outbox.MetadataID, outbox.StableID("orders", 0, int64(i+1)))
			m.Metadata.Set(outbox.MetadataSeq, strconv.Itoa(i+1))
			m.Metadata.Set(outbox.MetadataSource, source)
		}
		if done, err := target.Send(outboxtest.Ctx(t), stream, msgs); done != 3 || err != nil {
			t.Fatalf("%s: %d of 3, %v", source, done, err)
		}
	}
	send("eu")
	send("us")
	send("us") // a copy: the same ids from the same source
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(outboxtest.Ctx(t), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 6 {
		t.Fatalf("the stream holds %d messages, want 6: eu's 3 and us's 3, us's copies dropped", info.State.Msgs)
	}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(outboxtest.Ctx(t), seq)
		if err != nil {
			t.Fatal(err)
		}
		src, id := m.Header.Get(outbox.MetadataSource), m.Header.Get(outbox.MetadataID)
		if want := map[bool]string{true: "eu", false: "us"}[seq <= 3]; src != want || m.Header.Get(nats.MsgIdHdr) != want+":"+id {
			t.Fatalf("stream message %d: source %q, Nats-Msg-Id %q; want %s and %s:%s", seq, src, m.Header.Get(nats.MsgIdHdr), want, want, id)
		}
	}
}

package jetstream_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// startNATS starts an embedded nats-server with JetStream (port -1: any
// free port) and stops it when the test ends.
func startNATS(t *testing.T, port int, dir string, tune func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true}
	if tune != nil {
		tune(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

func natsPort(s *server.Server) int { return s.Addr().(*net.TCPAddr).Port }

// createStream creates stream name over subject name, with the given
// duplicate window and max message size (0: the defaults).
func createStream(t *testing.T, url, name string, maxMsgSize int32) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{
		Name: name, Subjects: []string{name}, Storage: natsjs.FileStorage,
		Duplicates: 2 * time.Minute, MaxMsgSize: maxMsgSize,
	}); err != nil {
		t.Fatal(err)
	}
}

func newJetStreamTarget(t *testing.T, url string) *jetstream.Target {
	t.Helper()
	target, err := jetstream.NewTarget(jetstream.Config{
		URL: url, AckTimeout: 2 * time.Second,
		Options: []nats.Option{nats.ReconnectWait(100 * time.Millisecond)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	return target
}

// consumeJetStream reads the whole stream of topic with watermill-nats's
// JetStream subscriber until the test ends.
func consumeJetStream(t *testing.T, url, topic string, r *fwdtest.Received) {
	t.Helper()
	sub, err := wmjs.NewSubscriber(wmjs.SubscriberConfig{URL: url, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			r.Add(m, -1)
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
}

func TestJetStreamConfigNeedsNoReconnectBuffer(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := jetstream.NewTarget(jetstream.Config{Conn: nc}, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("connection with a reconnect buffer: %v", err)
	}
	nc2, err := nats.Connect(s.ClientURL(), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if _, err := jetstream.NewTarget(jetstream.Config{Conn: nc2}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.NewTarget(jetstream.Config{}, nil); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("no URL, no Conn: %v", err)
	}
}

// Two instances forward; A dies in the middle of a batch (half of it
// stored in JetStream, the cursor not moved, its leases not renewed) and B
// takes over and sends the batch again. Thanks to Nats-Msg-Id the server
// drops the copies: the consumer gets every message exactly once, in key
// order.
func TestJetStreamExactlyOnceInKeyOrderWhenAnInstanceDiesMidBatch(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 8)
	s := startNATS(t, -1, t.TempDir(), nil)
	createStream(t, s.ClientURL(), "orders", 0)

	pub := fwdtest.NewPublisher(t, e)
	for i := 0; i < 40; i++ {
		pub.Round("orders", 16, func(m *message.Message) { m.Metadata.Set("note", "kept") })
	}
	poolA, freezeA, thawA := pgtest.FreezablePool(t)
	crashing := fwdtest.NewCrashingTarget(newJetStreamTarget(t, s.ClientURL()), 100, freezeA)
	fwdtest.StartForwarder(t, e, poolA, crashing, []string{"orders"}, nil)
	<-crashing.Crashed
	t.Cleanup(func() { thawA(); close(crashing.Release) }) // runs before A's Close
	b := fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, s.ClientURL()), []string{"orders"}, nil)

	r := &fwdtest.Received{}
	consumeJetStream(t, s.ClientURL(), "orders", r)
	outboxtest.WaitFor(t, "every message in JetStream", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	time.Sleep(300 * time.Millisecond) // a late duplicate would show now
	if dups := r.Check(t, pub.Snapshot(), nil); dups != 0 {
		t.Fatalf("%d duplicates reached the consumer", dups)
	}
	t.Logf("A sent %d messages and half a batch (%d) before dying; B %+v", crashing.Sent.Load(), crashing.HalfLen.Load(), b.Stats())
	if crashing.HalfLen.Load() == 0 {
		t.Fatal("A did not send half a batch")
	}
	for _, g := range r.Messages() {
		if g.Metadata.Get("note") != "kept" || g.Metadata.Get(outbox.MetadataAttempt) != "" || g.Metadata.Get(nats.MsgIdHdr) != "" {
			t.Fatalf("metadata %v", g.Metadata)
		}
	}
}

// The NATS server goes down in the middle of the stream and comes back on
// the same port with the same store; meanwhile messages keep being
// committed. The forwarder waits and resumes: every message arrives once,
// in key order.
func TestJetStreamServerDownAndBackMidStream(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	dir := t.TempDir()
	s := startNATS(t, -1, dir, nil)
	port, url := natsPort(s), s.ClientURL()
	createStream(t, url, "orders", 0)
	fwd := fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, url), []string{"orders"}, nil)

	pub := fwdtest.NewPublisher(t, e)
	stop := pub.Keep("orders", 12, 20*time.Millisecond)
	outboxtest.WaitFor(t, "a part of the stream forwarded", time.Minute, func() bool { return fwd.Stats().Messages > 300 })
	s.Shutdown()
	s.WaitForShutdown()
	outboxtest.WaitFor(t, "failed sends while NATS is down", time.Minute, func() bool { return fwd.Stats().Failures > 3 })
	time.Sleep(2 * time.Second)
	before := fwd.Stats()
	startNATS(t, port, dir, nil) // stopped by the test's cleanup
	time.Sleep(time.Second)
	stop()
	t.Logf("published %d; forwarded %d before the restart, %d failed sends (%s)", pub.Count(), before.Messages, before.Failures, before.LastError)

	r := &fwdtest.Received{}
	consumeJetStream(t, url, "orders", r)
	outboxtest.WaitFor(t, "every message in JetStream", 2*time.Minute, func() bool { return r.Distinct() == pub.Count() })
	time.Sleep(300 * time.Millisecond)
	dups := r.Check(t, pub.Snapshot(), nil)
	t.Logf("%d messages arrived, %d duplicates; stats %+v", r.Total(), dups, fwd.Stats())
	if dups != 0 {
		t.Fatalf("%d duplicates reached the consumer", dups)
	}
}

// Until the stream exists, sends fail (no responders); once it is created,
// the forwarder catches up.
func TestJetStreamWaitsForTheStream(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 2)
	s := startNATS(t, -1, t.TempDir(), nil)
	fwd := fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, s.ClientURL()), []string{"orders"}, nil)
	pub := fwdtest.NewPublisher(t, e)
	for i := 0; i < 10; i++ {
		pub.Round("orders", 5, nil)
	}
	outboxtest.WaitFor(t, "failed sends", time.Minute, func() bool { return fwd.Stats().Failures > 2 })
	createStream(t, s.ClientURL(), "orders", 0)
	r := &fwdtest.Received{}
	consumeJetStream(t, s.ClientURL(), "orders", r)
	outboxtest.WaitFor(t, "every message in JetStream", time.Minute, func() bool { return r.Distinct() == pub.Count() })
	if dups := r.Check(t, pub.Snapshot(), nil); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	t.Logf("stats %+v", fwd.Stats())
}

// Poison for NATS: a message over the stream's MaxMsgSize (refused by the
// server), one over the server's max_payload (refused by the client) and
// one whose metadata key is no valid header name go to the dead-letter
// table; the stream continues around them, in order.
func TestJetStreamPoisonMessagesAreDeadLettered(t *testing.T) {
	e := fwdtest.NewEnv(t)
	e.Register("orders", 4)
	s := startNATS(t, -1, t.TempDir(), func(o *server.Options) { o.MaxPayload = 64 << 10 })
	createStream(t, s.ClientURL(), "orders", 16<<10)

	pub := fwdtest.NewPublisher(t, e)
	want := map[string]string{} // uuid -> expected reason fragment
	for i := 0; i < 20; i++ {
		pub.Round("orders", 10, func(m *message.Message) {
			switch m.Metadata.Get("n") + "/" + m.Metadata.Get(outbox.PublishPartitionKeyMetadata) {
			case "5/key-3":
				m.Payload = make([]byte, 20<<10) // over the stream's MaxMsgSize
				want[m.UUID] = "maximum"
			case "7/key-4":
				m.Payload = make([]byte, 100<<10) // over max_payload
				want[m.UUID] = "maximum payload"
			case "9/key-1":
				m.Metadata.Set("bad key", "x") // no valid NATS header name
				want[m.UUID] = "header"
			}
		})
	}
	fwd := fwdtest.StartForwarder(t, e, nil, newJetStreamTarget(t, s.ClientURL()), []string{"orders"}, nil)
	r := &fwdtest.Received{}
	consumeJetStream(t, s.ClientURL(), "orders", r)
	outboxtest.WaitFor(t, "every message forwarded or dead-lettered", time.Minute, func() bool {
		return r.Distinct() == pub.Count()-len(want) && len(e.DeadLettered(t)) == len(want)
	})
	dead := e.DeadLettered(t)
	for u, reason := range want {
		if !strings.Contains(dead[u], reason) {
			t.Fatalf("message %s: dead-letter reason %q, want it to mention %q", u, dead[u], reason)
		}
	}
	if dups := r.Check(t, pub.Snapshot(), dead); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	t.Logf("dead letters %v; stats %+v", dead, fwd.Stats())
}

// NewTarget with a URL nobody answers fails typed (ErrConnect, and the
// NATS client's ErrNoServers), says what to check, and hides the password.
func TestNewTargetUnreachableIsTyped(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // a port nobody listens on
	target, err := jetstream.NewTarget(jetstream.Config{URL: "nats://forwarder:s3cret@" + addr}, nil)
	if err == nil {
		_ = target.Close()
		t.Fatal("NewTarget of an unreachable URL: nil error")
	}
	if !errors.Is(err, jetstream.ErrConnect) || !errors.Is(err, nats.ErrNoServers) {
		t.Errorf("NewTarget of an unreachable URL: %v, want ErrConnect and nats.ErrNoServers", err)
	}
	if msg := err.Error(); strings.Contains(msg, "s3cret") || !strings.Contains(msg, addr) || !strings.Contains(msg, "nats-server -js") {
		t.Errorf("the error %q: want the address without the password, and what to check", msg)
	}
}

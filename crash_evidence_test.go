package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// The crash loop: a consumer process (this test binary, run as
// TestCrashLoopConsumerChild) that a few messages make exit, restarted after
// every crash until the topic is drained. A message is charged for a crash
// only on evidence that it was the delivery in flight: the one delivery in
// flight in its process. Healthy messages that happened to be in flight in
// the same process, in this partition or another, are never charged; every
// crashing message is dead-lettered after exactly MaxAttempts deliveries.
// Through a Router (one message at a time per partition, 16 partitions in
// flight), in both strategies, and through ConsumeBatches (a whole batch in
// flight at once).
//
// A suspect is delivered alone when the process's other deliveries end
// within HandlerTimeout; when they do not (a busy machine), the Subscriber
// delivers it with them and says so (docs/failure-modes.md §3): that
// delivery is no evidence and charges nothing, so the message gets one
// delivery more. The children log those deliveries, and the test counts
// them in: a crashing message is dead-lettered after exactly MaxAttempts
// deliveries plus those.
func TestCrashLoopChargesOnlyTheMessageThatCrashes(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_CRASHLOOP_CHILD") != "" {
		t.Skip("running as the child")
	}
	for _, c := range []struct {
		mode     string
		messages int
	}{{"leased", 2000}, {"transactional", 1000}, {"batches", 1000}} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel() // each in a schema of its own, with processes of its own
			crashLoop(t, c.mode, c.messages)
		})
	}
}

func crashLoop(t *testing.T, mode string, messages int) {
	const (
		partitions  = 16
		maxAttempts = 3
	)
	crashing := messages / 200 // 0.5%
	e := newEnv(t)
	e.Register("orders", partitions)
	e.Exec("CREATE TABLE " + e.Schema + ".deliveries (uuid text, attempt int, pid int)")
	e.Exec("CREATE TABLE " + e.Schema + ".effects (uuid text)")
	e.Exec("CREATE TABLE " + e.Schema + ".rejects (uuid text PRIMARY KEY, seq bigint, attempts int, reason text)")

	rng := rand.New(rand.NewPCG(25, 0))
	crashers := map[string]bool{}
	for len(crashers) < crashing {
		crashers[fmt.Sprintf("m%04d", rng.IntN(messages))] = true
	}
	msgs := make([]*message.Message, messages)
	for i := range msgs {
		uuid := fmt.Sprintf("m%04d", i)
		payload := "ok"
		if crashers[uuid] {
			payload = "crash"
		}
		msgs[i] = outboxtest.Keyed(uuid, "k"+strconv.Itoa(i%160), i, payload)
	}
	e.Publish("orders", msgs...)
	if n := e.SequenceAll(); n != messages {
		t.Fatalf("sequenced %d messages, want %d", n, messages)
	}

	crashes := 0
	shared := map[partSeq]int{} // suspects delivered with others, not alone: how many times
	for run := 0; ; run++ {
		if run > crashing*(maxAttempts+1)+5+sum(shared) {
			t.Fatalf("still crashing after %d runs", run)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopConsumerChild$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			"OUTBOX_CRASHLOOP_CHILD=1",
			pgtest.EnvDatabaseURL+"="+pgtest.DatabaseURL(),
			"OUTBOX_CRASHLOOP_SCHEMA="+e.Schema,
			"OUTBOX_CRASHLOOP_MODE="+mode,
			"OUTBOX_CRASHLOOP_MAX_ATTEMPTS="+strconv.Itoa(maxAttempts))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var err error
		select {
		case err = <-exited:
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("the child neither crashed nor drained the topic:\n%s", out.String())
		}
		sharedDeliveries(out.String(), shared)
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			crashes++
			continue
		}
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "PASS") {
			t.Fatalf("the child did not run:\n%s", out.String())
		}
		break // drained
	}

	// Dead letters: exactly the crashing messages, each after MaxAttempts.
	rows, err := e.Pool.Query(outboxtest.Ctx(t), "SELECT uuid, attempts, reason FROM "+e.Schema+".rejects ORDER BY uuid")
	if err != nil {
		t.Fatal(err)
	}
	type rejected struct {
		UUID     string
		Attempts int
		Reason   string
	}
	dead, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rejected])
	if err != nil {
		t.Fatal(err)
	}
	// Each crashing message's deliveries: MaxAttempts, plus those made
	// with others as a suspect that could not be delivered alone.
	wantDeliveries := map[string]int{}
	for c := range crashers {
		wantDeliveries[c] = maxAttempts
	}
	for ps, n := range shared {
		uuid := ""
		if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT uuid FROM "+e.Schema+".log WHERE topic = 'orders' AND partition = $1 AND seq = $2",
			ps.partition, ps.seq).Scan(&uuid); err != nil {
			t.Fatalf("the suspect at partition %d, seq %d: %v", ps.partition, ps.seq, err)
		}
		if crashers[uuid] {
			wantDeliveries[uuid] += n
		}
		t.Logf("%s (partition %d, seq %d) delivered %d time(s) as a suspect with other deliveries: they did not end within HandlerTimeout", uuid, ps.partition, ps.seq, n)
	}
	deadSet := map[string]bool{}
	for _, d := range dead {
		deadSet[d.UUID] = true
		if !crashers[d.UUID] {
			t.Errorf("healthy message %s dead-lettered (attempts %d): %s", d.UUID, d.Attempts, d.Reason)
			continue
		}
		if want := wantDeliveries[d.UUID]; d.Attempts != want {
			t.Errorf("crashing message %s dead-lettered with attempts %d, want %d (MaxAttempts %d): %s", d.UUID, d.Attempts, want, maxAttempts, d.Reason)
		}
		// The reason tells the same number of deliveries (issue 39).
		if !strings.Contains(d.Reason, fmt.Sprintf("delivered %d times", d.Attempts)) {
			t.Errorf("crashing message %s dead-lettered with attempts %d and a reason that does not say so: %s", d.UUID, d.Attempts, d.Reason)
		}
	}
	for c := range crashers {
		if !deadSet[c] {
			t.Errorf("crashing message %s was not dead-lettered", c)
		}
	}

	// Deliveries of each crashing message: numbered 1..n, n its
	// MaxAttempts plus its deliveries as a suspect with others, each number
	// once, the last one n. One delivery of a message may
	// have no log row: cut short by another message's crash before its
	// handler logged it, or (a crash outside careful mode, whose batch is
	// recorded in flight as a whole) not yet handed out when another
	// message's crash made it a suspect; either counts as a delivery. The
	// test says how many there were.
	cut := 0
	for c := range crashers {
		rows, err := e.Pool.Query(outboxtest.Ctx(t), "SELECT attempt FROM "+e.Schema+".deliveries WHERE uuid = $1 ORDER BY attempt", c)
		if err != nil {
			t.Fatal(err)
		}
		attempts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		n := int32(wantDeliveries[c])
		seen := map[int32]bool{}
		for _, a := range attempts {
			if a < 1 || a > n || seen[a] {
				t.Errorf("crashing message %s: deliveries numbered %v, want each of 1..%d at most once", c, attempts, n)
				break
			}
			seen[a] = true
		}
		if !seen[n] || len(attempts) < int(n)-1 {
			t.Errorf("crashing message %s: deliveries numbered %v, want 1..%d", c, attempts, n)
		}
		cut += int(n) - len(attempts)
	}

	// Every healthy message handled, and the topic drained.
	missing := e.Int(`SELECT count(*) FROM (SELECT uuid FROM ` + e.Schema + `.log WHERE topic = 'orders'
		EXCEPT SELECT uuid FROM ` + e.Schema + `.effects EXCEPT SELECT uuid FROM ` + e.Schema + `.rejects) x`)
	if missing != 0 {
		t.Errorf("%d messages neither handled nor dead-lettered", missing)
	}
	behind := e.Int(`SELECT count(*) FROM ` + e.Schema + `.cursors c JOIN ` + e.Schema + `.partitions p
		ON p.topic = c.topic AND p.partition = c.partition WHERE c.group_name = 'g' AND c.seq < p.last_seq`)
	if behind != 0 {
		t.Errorf("%d partitions not drained", behind)
	}
	healthyRedelivered := e.Int(`SELECT count(*) FROM (SELECT uuid FROM `+e.Schema+`.deliveries GROUP BY uuid HAVING count(*) > 1) x
		WHERE uuid <> ALL($1)`, mapKeys(crashers))
	t.Logf("%d crashes for %d crashing messages of %d; %d deliveries of crashing messages counted without a log row (cut short, or made a suspect by another's crash); %d deliveries of suspects with others (not alone in time); %d healthy messages delivered more than once",
		crashes, crashing, messages, cut, sum(shared), healthyRedelivered)
}

// partSeq names a message of the topic by its partition and seq.
type partSeq struct {
	partition int
	seq       int64
}

// sharedSuspectPrefix starts the lines a child prints (sharedSuspectLogger)
// for a suspect delivered with others rather than alone.
const sharedSuspectPrefix = "crashloop: suspect delivered with others:"

// sharedDeliveries adds the suspects a child's output says were delivered
// with others to counts.
func sharedDeliveries(out string, counts map[partSeq]int) {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(line, sharedSuspectPrefix)
		if !ok {
			continue
		}
		var ps partSeq
		if _, err := fmt.Sscanf(rest, " partition=%d seq=%d", &ps.partition, &ps.seq); err == nil {
			counts[ps]++
		}
	}
}

func sum(m map[partSeq]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// sharedSuspectLogger is the child's logger: it prints a line (for the
// parent) for each suspect the Subscriber delivers with others because the
// process's other deliveries did not end within HandlerTimeout (its Info
// "A suspect cannot be delivered alone", internal/consumer/gate.go), and
// nothing else.
type sharedSuspectLogger struct{ fields watermill.LogFields }

func (l sharedSuspectLogger) Error(string, error, watermill.LogFields) {}
func (l sharedSuspectLogger) Info(msg string, fields watermill.LogFields) {
	if strings.HasPrefix(msg, "A suspect cannot be delivered alone") {
		all := l.fields.Add(fields)
		fmt.Printf("%s partition=%v seq=%v\n", sharedSuspectPrefix, all["partition"], all["seq"])
	}
}
func (l sharedSuspectLogger) Debug(string, watermill.LogFields) {}
func (l sharedSuspectLogger) Trace(string, watermill.LogFields) {}
func (l sharedSuspectLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return sharedSuspectLogger{l.fields.Add(fields)}
}

func mapKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCrashLoopConsumerChild is the consumer process of the test above: a
// Watermill Router (or a ConsumeBatches handler) that logs each delivery,
// then exits with status 3 for a crashing message or records its effect
// (in the Subscriber's transaction, for the Transactional strategy) and
// acks. It exits with 0 once every partition is drained.
func TestCrashLoopConsumerChild(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_CRASHLOOP_CHILD") == "" {
		t.Skip("only runs as the child of TestCrashLoopChargesOnlyTheMessageThatCrashes")
	}
	schema := os.Getenv("OUTBOX_CRASHLOOP_SCHEMA")
	maxAttempts, _ := strconv.Atoi(os.Getenv("OUTBOX_CRASHLOOP_MAX_ATTEMPTS"))
	pool := pgtest.Pool(t)
	e := env{outboxtest.Attach(t, pool, schema)}
	rejects := outboxtype.RejectHandlerFunc(func(c context.Context, tx pgx.Tx, m outboxtype.RejectedMessage) error {
		_, err := tx.Exec(c, "INSERT INTO "+schema+".rejects VALUES ($1, $2, $3, $4)", m.UUID, m.Seq, m.Attempts, m.Reason.Error())
		return err
	})
	tu := outboxtest.FastTuning()
	tu.LeaseTTL = 600 * time.Millisecond
	tu.BackoffBase, tu.BackoffMax = 5*time.Millisecond, 10*time.Millisecond
	mode := os.Getenv("OUTBOX_CRASHLOOP_MODE")
	strategy := outbox.Leased
	if mode == "transactional" {
		strategy = outbox.Transactional
	}
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: schema, Pool: pool, ConsumerGroup: "g", Tuning: tu, Advanced: outboxtest.FastAdvanced(),
		RejectHandler: rejects, MaxAttempts: maxAttempts, Strategy: strategy,
	}, sharedSuspectLogger{})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(m *message.Message) error {
		attempt, _ := strconv.Atoi(m.Metadata.Get(outbox.MetadataAttempt))
		if _, err := pool.Exec(context.Background(), "INSERT INTO "+schema+".deliveries VALUES ($1, $2, $3)", m.UUID, attempt, os.Getpid()); err != nil {
			return err
		}
		if string(m.Payload) == "crash" {
			os.Exit(3) // no deferred call, no Nack: as a crash
		}
		effect := "INSERT INTO " + schema + ".effects VALUES ($1)"
		if tx, ok := outbox.TxFromContext[pgx.Tx](m.Context()); ok {
			_, err := tx.Exec(m.Context(), effect, m.UUID)
			return err
		}
		_, err := pool.Exec(m.Context(), effect, m.UUID)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if mode == "batches" {
		go func() {
			_ = sub.ConsumeBatches(ctx, "orders", func(_ context.Context, batch []*message.Message) (int, error) {
				for i, m := range batch {
					if err := handle(m); err != nil {
						return i, err
					}
				}
				return len(batch), nil
			})
		}()
	} else {
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		router.AddConsumerHandler("crashloop", "orders", sub, handle)
		go func() { _ = router.Run(ctx) }()
		defer router.Close()
	}
	outboxtest.WaitFor(t, "every partition drained", 80*time.Second, func() bool {
		return e.Int(`SELECT count(*) FROM `+schema+`.cursors c JOIN `+schema+`.partitions p
			ON p.topic = c.topic AND p.partition = c.partition WHERE c.group_name = 'g' AND c.seq >= p.last_seq`) == 16
	})
	cancel()
	_ = sub.Close()
}

// A Subscriber closed while a handler holds a message (rebalance, pause and
// Close end a lease the same way) is no crash: the next holder finds no
// delivery left in flight, charges nothing and suspects nothing, in both
// strategies.
func TestGracefulStopMidDeliveryIsNotACrash(t *testing.T) {
	t.Parallel()
	for _, strategy := range []outbox.Strategy{outbox.Leased, outbox.Transactional} {
		t.Run(strategy.String(), func(t *testing.T) {
			e := newEnv(t)
			e.Register("orders", 1)
			e.Publish("orders", message.NewMessage("m1", []byte("x")), message.NewMessage("m2", []byte("x")))
			e.SequenceAll()
			rejects, _ := rejectLog(t, e)
			first := e.Subscriber("g", func(c *outbox.SubscriberConfig) {
				c.Strategy, c.RejectHandler, c.MaxAttempts, c.DisableSequencer = strategy, rejects, 2, true
				c.CloseTimeout = 100 * time.Millisecond
			})
			msgs, err := first.Subscribe(outboxtest.Ctx(t), "orders")
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-msgs: // held, never answered
			case <-time.After(20 * time.Second):
				t.Fatal("m1 was not delivered")
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			var inflight, attempts, suspects int64
			if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT inflight_to, attempts, suspect_to FROM "+e.Schema+".cursors WHERE group_name = 'g'").
				Scan(&inflight, &attempts, &suspects); err != nil {
				t.Fatal(err)
			}
			if inflight != 0 || attempts != 0 || suspects != 0 {
				t.Fatalf("after a graceful stop: in flight to %d, attempts %d, suspects to %d; want nothing to settle", inflight, attempts, suspects)
			}
			second := e.Subscriber("g", func(c *outbox.SubscriberConfig) {
				c.Strategy, c.RejectHandler, c.MaxAttempts, c.DisableSequencer = strategy, rejects, 2, true
			})
			msgs2, err := second.Subscribe(outboxtest.Ctx(t), "orders")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"m1", "m2"} {
				select {
				case m := <-msgs2:
					if m.UUID != want {
						t.Fatalf("got %s, want %s", m.UUID, want)
					}
					m.Ack()
				case <-time.After(20 * time.Second):
					t.Fatalf("%s was not delivered again", want)
				}
			}
			if s := second.Stats(); s.Crashed != 0 {
				t.Fatalf("the next holder counted %d crashes", s.Crashed)
			}
		})
	}
}

package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
)

// A nil pool and a Relay not made by New get typed errors, not panics.
func TestNilPoolAndZeroRelayGetTypedErrors(t *testing.T) {
	ctx := outboxtest.Ctx(t)
	statusOf := func() error { _, err := relay.StatusOf(ctx, nil, ""); return err }
	for name, err := range map[string]error{
		"Prerequisites":    relay.Prerequisites(ctx, nil),
		"CreateSlot":       relay.CreateSlot(ctx, nil, ""),
		"DropSlot":         relay.DropSlot(ctx, nil, "", false),
		"DropSlot (force)": relay.DropSlot(ctx, nil, "", true),
		"StatusOf":         statusOf(),
	} {
		if !errors.Is(err, outbox.ErrUnsupportedTx) || !strings.Contains(err.Error(), "nil *pgxpool.Pool") {
			t.Errorf("%s with a nil pool: %v, want ErrUnsupportedTx naming the nil pool", name, err)
		}
	}
	for name, r := range map[string]*relay.Relay{"zero": new(relay.Relay), "nil": nil} {
		if err := r.Run(ctx); !errors.Is(err, outbox.ErrInvalidArgument) || !strings.Contains(err.Error(), "relay.New") {
			t.Errorf("Run of a %s Relay: %v, want ErrInvalidArgument naming relay.New", name, err)
		}
		if _, err := r.Status(ctx); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Errorf("Status of a %s Relay: %v, want ErrInvalidArgument", name, err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("Close of a %s Relay: %v", name, err)
		}
		if st := r.Stats(); st != (relay.Stats{}) {
			t.Errorf("Stats of a %s Relay: %+v", name, st)
		}
	}
	if e := new(relay.SlotInUseError); e.Error() == "" || !errors.Is(e, relay.ErrSlotInUse) {
		t.Errorf("zero SlotInUseError: %q", e.Error())
	}
}

// waitInactive waits until no process streams the schema's slot (a closed
// relay's walsender ends a moment after its connection).
func waitInactive(t *testing.T, b *outboxtest.Bundle) {
	t.Helper()
	waitFor(t, "the slot to be released", func() bool {
		st, err := relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
		return err == nil && !st.Active
	})
}

// DropSlot without force refuses while the slot holds committed messages
// no relay has appended (counted, other prefixes and what the log already
// has left out) or while a transaction that published into it is open
// (named by its pid); once the log has everything and no such transaction
// is open it drops the slot, and publishes fail from then on. With force it
// drops the slot whatever it holds.
func TestDropSlotRefusesWhatItWouldLose(t *testing.T) {
	b := setup(t, "orders", 2)
	ctx := outboxtest.Ctx(t)
	pub := walPublisher(t, b)
	for i := range 3 {
		var msgs []*message.Message
		for j := range 10 {
			msgs = append(msgs, message.NewMessage(fmt.Sprintf("m%d-%d", i, j), []byte("0123456789")))
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			t.Fatal(err)
		}
	}
	// Not the schema's: another prefix, and one that merely starts like it.
	b.Exec("SELECT pg_logical_emit_message(true, 'watermill-outbox:other', 'x'), pg_logical_emit_message(true, 'watermill-outbox:' || $1 || 'x', 'y')", b.Schema)

	err := relay.DropSlot(ctx, b.Pool, b.Schema, false)
	var inUse *relay.SlotInUseError
	if !errors.As(err, &inUse) || !errors.Is(err, relay.ErrSlotInUse) {
		t.Fatalf("DropSlot of a slot holding 30 messages no relay appended: %v, want a *SlotInUseError", err)
	}
	if inUse.Unrelayed != 30 || inUse.Bytes < 30*10 || inUse.Truncated || len(inUse.OpenTransactions) != 0 {
		t.Fatalf("DropSlot's refusal: %+v, want 30 messages of at least 300 bytes", inUse)
	}
	for _, want := range []string{"30 committed messages", "outbox pipeline --wal", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("DropSlot's refusal %q does not say %q", err, want)
		}
	}
	if st, err := relay.StatusOf(ctx, b.Pool, b.Schema); err != nil || !st.Exists {
		t.Fatalf("the slot after a refused DropSlot: %+v, %v", st, err)
	}

	// A relay appends them; it never confirms a position to the server, so
	// the slot still holds every transaction, all of them in the log now.
	relay.NeverConfirm(true)
	t.Cleanup(func() { relay.NeverConfirm(false) })
	r := startRelay(t, b.Pool, b.Schema, nil, nil)
	waitLog(t, b, "orders", 30)
	_ = r.Close()
	waitInactive(t, b)

	// A transaction that published and is still open.
	tx, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Rollback: a no-op
	txPub, err := outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: b.Schema, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := txPub.Publish("orders", message.NewMessage("open", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	err = relay.DropSlot(ctx, b.Pool, b.Schema, false)
	if !errors.As(err, &inUse) || inUse.Unrelayed != 0 || !slices.Equal(inUse.OpenTransactions, []int32{pid}) ||
		!strings.Contains(err.Error(), "1 open transaction that published into it") || !strings.Contains(err.Error(), strconv.Itoa(int(pid))) {
		t.Fatalf("DropSlot while a transaction that published is open (pid %d): %v", pid, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Nothing left to lose.
	if err := relay.DropSlot(ctx, b.Pool, b.Schema, false); err != nil {
		t.Fatalf("DropSlot once the log holds every message: %v", err)
	}
	if st, err := relay.StatusOf(ctx, b.Pool, b.Schema); err != nil || st.Exists {
		t.Fatalf("the slot after DropSlot: %+v, %v", st, err)
	}
	if err := pub.Publish("orders", message.NewMessage("late", []byte("x"))); !errors.Is(err, outbox.ErrNoSlot) {
		t.Fatalf("Publish after DropSlot: %v, want ErrNoSlot", err)
	}

	// Forced: dropped with a message not appended and a transaction open.
	if err := relay.CreateSlot(ctx, b.Pool, b.Schema); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("orders", message.NewMessage("doomed", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	tx2, err := b.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
	txPub2, err := outbox.NewTxPublisher(tx2, outbox.PublisherConfig{Schema: b.Schema, Mode: outbox.ModeWAL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := txPub2.Publish("orders", message.NewMessage("doomed-too", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if err := relay.DropSlot(ctx, b.Pool, b.Schema, false); !errors.Is(err, relay.ErrSlotInUse) {
		t.Fatalf("DropSlot of the new slot: %v, want ErrSlotInUse", err)
	}
	done := make(chan error, 1)
	go func() { done <- relay.DropSlot(ctx, b.Pool, b.Schema, true) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("DropSlot with force: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("DropSlot with force waited for the open transaction")
	}
	if err := pub.Publish("orders", message.NewMessage("after-force", []byte("x"))); !errors.Is(err, outbox.ErrNoSlot) {
		t.Fatalf("Publish after a forced DropSlot: %v, want ErrNoSlot", err)
	}
	// Dropping again is no error: the schema is there, the slot gone.
	if err := relay.DropSlot(ctx, b.Pool, b.Schema, false); err != nil {
		t.Fatalf("DropSlot of a dropped slot: %v", err)
	}
	// A schema that never existed (a mistyped name) has nothing to drop:
	// said, not a silent nil.
	err = relay.DropSlot(ctx, b.Pool, "never_migrated_here", false)
	if !errors.Is(err, outbox.ErrNoSlot) || !strings.Contains(err.Error(), "check the schema name") {
		t.Fatalf("DropSlot of a schema that never existed: %v, want ErrNoSlot saying to check the name", err)
	}
}

// Each relay's replication connection carries its instance, and status
// (StatusOf, admin, the console) names the one streaming the slot: the
// active one, then, after it stops, the standby that took over.
func TestStatusNamesTheRelayStreamingTheSlot(t *testing.T) {
	b := setup(t, "orders", 1)
	ctx := outboxtest.Ctx(t)
	ra := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.Instance = "relay-a" }, nil)
	waitFor(t, "relay-a to stream", func() bool { return ra.Stats().Active })
	rb := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.Instance = "relay-b" }, nil)
	time.Sleep(200 * time.Millisecond) // relay-b tries the slot meanwhile, as a standby

	st, err := relay.StatusOf(ctx, b.Pool, b.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Active || st.ActiveInstance != "relay-a" || st.ActivePID == 0 || rb.Stats().Active {
		t.Fatalf("status while relay-a streams and relay-b waits: %+v", st)
	}
	// The server's own view: the walsender of that pid serves relay-a.
	var app string
	if err := b.Pool.QueryRow(ctx, "SELECT application_name FROM pg_stat_replication WHERE pid = $1", st.ActivePID).Scan(&app); err != nil {
		t.Fatal(err)
	}
	if app != relay.ReplicationNamePrefix+"relay-a" {
		t.Fatalf("application_name of the slot's walsender: %q", app)
	}
	adm, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := adm.Status(ctx, admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if w := rep.WALSlot; w == nil || w.ActiveInstance != "relay-a" || w.ActivePID != st.ActivePID {
		t.Fatalf("admin status of the slot: %+v", rep.WALSlot)
	}
	if page := consoleOverview(t, b); !strings.Contains(page, `<b id="wal-slot-instance">relay-a</b>`) {
		t.Fatalf("console overview does not name relay-a:\n%s", page)
	}

	_ = ra.Close()
	waitFor(t, "relay-b to take over", func() bool { return rb.Stats().Active })
	if st, err = relay.StatusOf(ctx, b.Pool, b.Schema); err != nil || st.ActiveInstance != "relay-b" {
		t.Fatalf("status once relay-b streams: %+v, %v", st, err)
	}
}

// The default instance is host:pid, within what PostgreSQL keeps.
func TestDefaultInstanceIsHostAndPid(t *testing.T) {
	host, _ := os.Hostname()
	got := relay.DefaultInstance()
	pid := ":" + strconv.Itoa(os.Getpid())
	if !strings.HasSuffix(got, pid) || !strings.HasPrefix(host, strings.TrimSuffix(got, pid)) || len(got) > relay.MaxInstanceLen {
		t.Fatalf("DefaultInstance() = %q on host %q, pid %d", got, host, os.Getpid())
	}
	if err := (relay.Config{Pool: &pgxpool.Pool{}, Instance: got}).Validate(); err != nil {
		t.Fatalf("the default instance is refused: %v", err)
	}
}

// DropSlot gets by with a pool of one connection (a tool's admin pool):
// it needed a second one and waited for ever.
func TestDropSlotWithAPoolOfOne(t *testing.T) {
	b := setup(t, "orders", 1)
	cfg := b.Pool.Config().Copy()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(outboxtest.Ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, force := range []bool{false, true} {
		if err := relay.CreateSlot(ctx, pool, b.Schema); err != nil {
			t.Fatal(err)
		}
		if err := relay.DropSlot(ctx, pool, b.Schema, force); err != nil {
			t.Fatalf("DropSlot (force %v) with a pool of one: %v", force, err)
		}
	}
}

// The slot's retained WAL is visible while no relay runs, the relay warns
// past WarnRetainedWAL, and once it has appended, the confirmed position
// covers what it appended; DropSlot refuses while a relay streams.
func TestSlotStatusRetainedWALAndDrop(t *testing.T) {
	b := setup(t, "orders", 1)
	st, err := relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Exists || st.Active || st.Slot != relay.Slot(b.Schema) {
		t.Fatalf("status after CreateSlot: %+v", st)
	}
	pub := walPublisher(t, b)
	var msgs []*message.Message
	for i := range 500 {
		msgs = append(msgs, message.NewMessage(fmt.Sprint(i), make([]byte, 2000)))
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	st, err = relay.StatusOf(outboxtest.Ctx(t), b.Pool, b.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetainedWALBytes < 500*2000 {
		t.Fatalf("retained WAL %d bytes after 1 MB published with no relay, want at least that", st.RetainedWALBytes)
	}
	// The operators' status says the same.
	adm, err := admin.New(admin.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := adm.Status(outboxtest.Ctx(t), admin.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if w := rep.WALSlot; w == nil || w.Active || w.Slot != st.Slot || w.RetainedWALBytes < 500*2000 {
		t.Fatalf("admin status of the slot with no relay: %+v", rep.WALSlot)
	}
	// And the console's overview, in words an operator acts on.
	page := consoleOverview(t, b)
	for _, want := range []string{"Replication slot <b>" + st.Slot + "</b>", "no relay streams it", "of WAL retained", `class="warn"`} {
		if !strings.Contains(page, want) {
			t.Fatalf("console overview lacks %q:\n%s", want, page)
		}
	}

	logs := &captureLogger{}
	r := startRelay(t, b.Pool, b.Schema, func(c *relay.Config) { c.WarnRetainedWAL = 1000 }, logs)
	waitLog(t, b, "orders", 500)
	if !logs.has("keeps more WAL than WarnRetainedWAL") {
		t.Fatalf("no warning about the retained WAL; logged: %v", logs.lines())
	}
	st, err = r.Status(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Active || st.AppendedLSN == 0 {
		t.Fatalf("status while streaming: %+v", st)
	}
	if rep, err = adm.Status(outboxtest.Ctx(t), admin.Filter{}); err != nil || rep.WALSlot == nil || !rep.WALSlot.Active {
		t.Fatalf("admin status of the slot while a relay streams: %+v, %v", rep.WALSlot, err)
	}
	if page := consoleOverview(t, b); !strings.Contains(page, "a relay streams it") || strings.Contains(page, "no relay streams it") {
		t.Fatalf("console overview while a relay streams:\n%s", page)
	}
	waitFor(t, "the confirmed position to pass the last append", func() bool {
		st, err = r.Status(outboxtest.Ctx(t))
		return err == nil && st.ConfirmedLSN > st.AppendedLSN
	})
	for _, force := range []bool{false, true} {
		if err := relay.DropSlot(outboxtest.Ctx(t), b.Pool, b.Schema, force); !errors.Is(err, relay.ErrSlotActive) {
			t.Fatalf("DropSlot (force %v) while a relay streams: %v, want ErrSlotActive", force, err)
		}
	}
}

package apicheck_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/twmb/franz-go/pkg/kfake"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/schema/schematest"

	fixture "github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// libraryPackages are the directories (relative to the module root) of the
// packages an application imports; the sweep must call every exported
// function and method of each. cmd/, bench/, _examples/ and internal/ are
// not library API.
var libraryPackages = []string{
	".", "adaptive", "admin", "console", "deadletter", "forwarder", "forwarder/jetstream", "forwarder/kafka", "inbox",
	"metrics", "outboxtest", "outboxtype", "partitioning", "pipeline", "relay", "retention", "schema/schematest",
}

// An entry calls one exported function or method (its name as
// "package.Func" or "package.Type.Method", the root package being
// "outbox") with nil and zero values for each pointer, interface, func, map
// and slice argument, on a receiver made by its constructor and, for a
// struct type, on its zero value (a type used without its constructor).
//
// Two kinds of argument stay real, because their own contracts forbid nil
// and no function could do anything useful with one: a context.Context
// (the context package: "Do not pass a nil Context, even if a function
// permits it"; the sweep passes an ended one to calls that would block) and
// a testing.TB, a test helper's only way to report.
type entry struct {
	name string
	run  func(e *env)
}

// callTimeout bounds one call: a call that does not return in time fails
// as a hang (e.g. a send on a nil channel).
const callTimeout = 30 * time.Second

// env is what the entries share: a real database with a migrated schema
// holding topic "orders" (2 partitions), and an unmigrated schema.
type env struct {
	t          *testing.T
	ctx        context.Context
	done       context.Context // already ended: for calls that run until ctx ends
	pool       *pgxpool.Pool
	schema     string
	unmigrated string
}

// call runs fn, which makes one call of the API described by what, in a
// goroutine of its own, and fails the test if it panics or hangs.
func (e *env) call(what string, fn func()) {
	e.t.Helper()
	type outcome struct {
		panicked bool
		value    any
		stack    string
	}
	ch := make(chan outcome, 1)
	go func() {
		o := outcome{panicked: true} // stays true on runtime.Goexit too: see below
		defer func() {
			if v := recover(); v != nil {
				o.value = v
				buf := make([]byte, 16<<10)
				o.stack = string(buf[:runtime.Stack(buf, false)])
			} else if o.panicked {
				o.value = "runtime.Goexit (a t.FailNow of a test helper)"
				o.panicked = false
			}
			ch <- o
		}()
		fn()
		o.panicked = false
	}()
	select {
	case o := <-ch:
		if o.stack != "" {
			e.t.Errorf("%s panicked: %v\n%s", what, o.value, o.stack)
		}
	case <-time.After(callTimeout):
		e.t.Errorf("%s did not return within %v", what, callTimeout)
	}
}

// fails calls fn under call and fails the test unless it returns an error
// of the library's vocabulary (see typed).
func (e *env) fails(what string, fn func() error) {
	e.t.Helper()
	var err error
	e.call(what, func() { err = fn() })
	switch {
	case err == nil:
		e.t.Errorf("%s: no error", what)
	case !typed(err):
		e.t.Errorf("%s: error %q (%T) matches none of the library's error values", what, err, err)
	}
}

// may calls fn under call: it may succeed, but an error must be typed.
func (e *env) may(what string, fn func() error) {
	e.t.Helper()
	var err error
	e.call(what, func() { err = fn() })
	if err != nil && !typed(err) {
		e.t.Errorf("%s: error %q (%T) matches none of the library's error values", what, err, err)
	}
}

// vocabulary is every error value the library exports: a refused input
// must be reported as one of them.
var vocabulary = []error{
	outbox.ErrInvalidName, outbox.ErrInvalidConfig, outbox.ErrSchemaTooNew, outbox.ErrPartitionMismatch,
	outbox.ErrInvalidPartitionCount, outbox.ErrPayloadTooLarge, outbox.ErrInvalidMessage, outbox.ErrPublisherClosed,
	outbox.ErrNilTx, outbox.ErrNoTx, outbox.ErrUnsupportedTx, outbox.ErrMixedTx, outbox.ErrUnknownTopic,
	outbox.ErrClosed, outbox.ErrNotMigrated, outbox.ErrNotInTx, outbox.ErrMetadataTooLarge,
	outbox.ErrPublishTooLarge, outbox.ErrPoison, outbox.ErrNotKeySpecific, outbox.ErrHandlerTimeout,
	outbox.ErrTxMisuse, outbox.ErrNotFound, outbox.ErrInvalidArgument, outbox.ErrAlreadyRunning,
	adaptive.ErrUnknownProfile, admin.ErrSeqOutOfRange, admin.ErrGroupActive,
	deadletter.ErrInvalidState, deadletter.ErrInvalidCursor, forwarder.ErrNotSent,
	inbox.ErrNoPosition, inbox.ErrStale,
	relay.ErrReplicationPrivilege, relay.ErrSlotActive, relay.ErrRecordVersion,
	schematest.ErrNotStarted, schematest.ErrListen, // its other errors match outbox's
	context.Canceled, context.DeadlineExceeded,
}

func typed(err error) bool {
	for _, v := range vocabulary {
		if errors.Is(err, v) {
			return true
		}
	}
	return false
}

// nilMsgs are the message slices a Publish-like call is given: none, a nil
// slice element.
var nilMsgs = [][]*message.Message{nil, {}, {nil}}

// fakeTB is the testing.TB of a test helper called by the sweep: it records
// a failure and ends the call as t.FailNow does.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Cleanup(fn func()) {}
func (f *fakeTB) Errorf(s string, args ...any) {
	f.failed = fmt.Sprintf(s, args...)
}
func (f *fakeTB) Fatalf(s string, args ...any) {
	f.failed = fmt.Sprintf(s, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any) {
	f.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

// nilDBs are the typed nil handles of the outbox.DB union.
func nilDBs(e *env, what string, fn func(db any) error) {
	e.t.Helper()
	for _, db := range []any{(*pgxpool.Pool)(nil), (*pgx.Conn)(nil), (*sql.DB)(nil), (*sql.Conn)(nil)} {
		e.fails(fmt.Sprintf("%s(%T(nil))", what, db), func() error { return fn(db) })
	}
}

func subCfg(e *env) outbox.SubscriberConfig {
	return outbox.SubscriberConfig{Pool: e.pool, Schema: e.schema, ConsumerGroup: "apicheck"}
}

// must(v, err)(e) is v, or ends the entry's test on err (a constructor
// given a valid config).
func must[T any](v T, err error) func(*env) T {
	return func(e *env) T {
		e.t.Helper()
		if err != nil {
			e.t.Fatal(err)
		}
		return v
	}
}

// startKafka is an in-process Kafka broker (kfake) for the targets.
func startKafka(e *env) []string {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// startNATS is an in-process nats-server with JetStream.
func startNATS(e *env) string {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: e.t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		e.t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		e.t.Fatal("nats-server not ready")
	}
	e.t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
}

var sendTarget = forwarder.TargetFunc(func(context.Context, string, []*message.Message) (int, error) { return 0, nil })

func newForwarder(e *env) *forwarder.Forwarder {
	return must(forwarder.NewForwarder(forwarder.Config{Subscriber: subCfg(e), Topics: []string{"orders"}, Target: sendTarget}, nil))(e)
}

// handler is a message handler that does nothing.
func handler(*message.Message) error { return nil }

// entries is the table: one entry per exported function and method of
// the library packages (TestSweepCoversEveryExportedFunction checks it).
var entries = slices.Concat(coreEntries, operationsEntries, forwarderEntries, consumersEntries, typesEntries, schematestEntries)

// requireWith runs RequirePublished with match m (a Match built from nil
// and zero arguments) over a topic that holds a message, so that m is
// applied.
func requireWith(e *env, what string, m outboxtest.Match) {
	e.call("RequirePublished(pool, orders, "+what+")", func() {
		outboxtest.RequirePublished(&fakeTB{}, e.pool, "orders", outboxtest.InSchema(e.schema), m)
	})
}

// TestNilAndZeroArgumentsNeverPanic runs the table: every exported
// function and method of the library, called with nil and zero arguments
// and receivers, returns (an error of the library's vocabulary where it
// returns one, or nothing at all) instead of panicking.
func TestNilAndZeroArgumentsNeverPanic(t *testing.T) {
	b := fixture.Setup(t)
	b.Register("orders", 2)
	b.Publish("orders", message.NewMessage("apicheck-1", []byte(`{"a":1}`)))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, en := range entries {
		t.Run(en.name, func(t *testing.T) {
			e := &env{t: t, ctx: fixture.Ctx(t), done: done, pool: b.Pool, schema: b.Schema, unmigrated: pgtest.Schema(t)}
			en.run(e)
		})
	}
}

// TestSweepCoversEveryExportedFunction parses the non-test sources of every
// library package and fails on an exported function or method (of an
// exported type) that has no entry in the table, or an entry that names
// none: a function added later cannot escape the sweep.
func TestSweepCoversEveryExportedFunction(t *testing.T) {
	want := map[string]bool{}
	for _, dir := range libraryPackages {
		for name := range exportedFuncs(t, filepath.Join("..", "..", dir)) {
			want[name] = true
		}
	}
	have := map[string]bool{}
	for _, en := range entries {
		if have[en.name] {
			t.Errorf("two entries for %s", en.name)
		}
		have[en.name] = true
	}
	var missing, stale []string
	for n := range want {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	for n := range have {
		if !want[n] {
			stale = append(stale, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	if len(missing) > 0 {
		t.Errorf("exported functions and methods the sweep does not call (add an entry to entries that calls each with nil and zero arguments):\n  %s", strings.Join(missing, "\n  "))
	}
	if len(stale) > 0 {
		t.Errorf("entries that name no exported function or method (renamed or removed?):\n  %s", strings.Join(stale, "\n  "))
	}
	if len(want) < 150 {
		t.Errorf("found only %d exported functions and methods: is the source parsed from the right place?", len(want))
	}
}

// exportedFuncs returns the exported functions and the exported methods of
// exported types declared in the package in dir (its non-test files), as
// "package.Func" and "package.Type.Method".
func exportedFuncs(t *testing.T, dir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]bool{}
	for _, de := range entries {
		n := de.Name()
		if de.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		pkg := f.Name.Name
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() {
				continue
			}
			if fd.Recv == nil {
				out[pkg+"."+fd.Name.Name] = true
				continue
			}
			recv := receiverType(fd.Recv.List[0].Type)
			if ast.IsExported(recv) {
				out[pkg+"."+recv+"."+fd.Name.Name] = true
			}
		}
	}
	return out
}

// receiverType is the name of a receiver's type: T for T, *T, T[P], *T[P].
func receiverType(x ast.Expr) string {
	for {
		switch v := x.(type) {
		case *ast.StarExpr:
			x = v.X
		case *ast.IndexExpr:
			x = v.X
		case *ast.IndexListExpr:
			x = v.X
		case *ast.ParenExpr:
			x = v.X
		case *ast.Ident:
			return v.Name
		default:
			return ""
		}
	}
}

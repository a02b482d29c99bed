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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"

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
	"metrics", "outboxtest", "partitioning", "relay", "retention",
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
	relay.ErrWALLevel, relay.ErrReplicationPrivilege, relay.ErrNoSlot, relay.ErrSlotActive, relay.ErrRecordVersion,
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
var entries = []entry{
	// ---- package outbox
	{"outbox.WithTx", func(e *env) {
		e.call("WithTx(ctx, nil)", func() { outbox.WithTx(e.ctx, nil) })
		e.call("WithTx(ctx, (*sql.Tx)(nil))", func() { outbox.WithTx(e.ctx, (*sql.Tx)(nil)) })
	}},
	{"outbox.TxFromContext", func(e *env) {
		e.call("TxFromContext(WithTx(ctx, nil))", func() { outbox.TxFromContext(outbox.WithTx(e.ctx, nil)) })
	}},
	{"outbox.PgxTxFromContext", func(e *env) {
		e.call("PgxTxFromContext(WithTx(ctx, nil))", func() { outbox.PgxTxFromContext(outbox.WithTx(e.ctx, nil)) })
		e.call("PgxTxFromContext(WithTx(ctx, pgx.Tx(nil)))", func() { outbox.PgxTxFromContext(outbox.WithTx(e.ctx, pgx.Tx(nil))) })
	}},
	{"outbox.SQLTxFromContext", func(e *env) {
		e.call("SQLTxFromContext(WithTx(ctx, (*sql.Tx)(nil)))", func() { outbox.SQLTxFromContext(outbox.WithTx(e.ctx, (*sql.Tx)(nil))) })
	}},
	{"outbox.StableID", func(e *env) { e.call("StableID zero", func() { outbox.StableID("", 0, 0) }) }},
	{"outbox.Reject", func(e *env) {
		e.fails("Reject(nil, nil)", func() error { return outbox.Reject(nil, nil) })
		e.call("Reject(msg, nil)", func() { _ = outbox.Reject(message.NewMessage("u", nil), nil) })
	}},
	{"outbox.RejectTo", func(e *env) {
		e.fails("RejectTo(nil, nil, nil)", func() error { return outbox.RejectTo(nil, nil, nil) })
		e.call("RejectTo(msg, nil, nil)", func() { _ = outbox.RejectTo(message.NewMessage("u", nil), nil, nil) })
		e.fails("RejectHandlerFunc(nil).HandleReject", func() error {
			return outbox.RejectHandlerFunc(nil).HandleReject(e.ctx, nil, outbox.RejectedMessage{})
		})
		e.call("RejectTo(msg, nil, RejectHandlerFunc(nil))", func() {
			_ = outbox.RejectTo(message.NewMessage("u", nil), nil, outbox.RejectHandlerFunc(nil))
		})
	}},
	{"outbox.IsDelivered", func(e *env) { e.call("IsDelivered(nil)", func() { outbox.IsDelivered(nil) }) }},
	{"outbox.KeyIsolation.Validate", func(e *env) {
		e.may("KeyIsolation{}.Validate", func() error { return outbox.KeyIsolation{}.Validate() })
	}},
	{"outbox.NotKeySpecific", func(e *env) { e.call("NotKeySpecific(nil)", func() { _ = outbox.NotKeySpecific(nil) }) }},
	{"outbox.Migrate", func(e *env) {
		nilDBs(e, "Migrate", func(db any) error {
			switch d := db.(type) {
			case *pgxpool.Pool:
				return outbox.Migrate(e.ctx, d, "")
			case *pgx.Conn:
				return outbox.Migrate(e.ctx, d, "")
			case *sql.DB:
				return outbox.Migrate(e.ctx, d, "")
			default:
				return outbox.Migrate(e.ctx, db.(*sql.Conn), "")
			}
		})
	}},
	{"outbox.CurrentSchemaVersion", func(e *env) {
		e.fails("CurrentSchemaVersion(nil pool)", func() error {
			_, err := outbox.CurrentSchemaVersion(e.ctx, (*pgxpool.Pool)(nil), "")
			return err
		})
		e.fails("CurrentSchemaVersion(nil *sql.DB)", func() error {
			_, err := outbox.CurrentSchemaVersion(e.ctx, (*sql.DB)(nil), "")
			return err
		})
	}},
	{"outbox.PartitionKeyFromMetadata", func(e *env) {
		e.may("PartitionKeyFromMetadata(nil)", func() error { _, err := outbox.PartitionKeyFromMetadata("", nil); return err })
	}},
	{"outbox.PublisherConfig.Validate", func(e *env) {
		e.may("PublisherConfig{}.Validate", func() error { return outbox.PublisherConfig{}.Validate() })
		e.may("PublisherConfig{Partitioner: PartitionerFunc(nil)}.Validate", func() error {
			return outbox.PublisherConfig{Partitioner: partitioning.PartitionerFunc(nil)}.Validate()
		})
		e.fails("PublisherConfig{DB: nil pool}.Validate", func() error {
			return outbox.PublisherConfig{DB: (*pgxpool.Pool)(nil), OwnTransaction: true}.Validate()
		})
	}},
	{"outbox.NewPublisher", func(e *env) {
		e.may("NewPublisher(zero, nil)", func() error { _, err := outbox.NewPublisher(outbox.PublisherConfig{}, nil); return err })
		e.fails("NewPublisher(DB: nil pool)", func() error {
			_, err := outbox.NewPublisher(outbox.PublisherConfig{DB: (*pgxpool.Pool)(nil), OwnTransaction: true}, nil)
			return err
		})
	}},
	{"outbox.NewTxPublisher", func(e *env) {
		e.fails("NewTxPublisher(nil, zero, nil)", func() error { _, err := outbox.NewTxPublisher(nil, outbox.PublisherConfig{}, nil); return err })
		e.fails("NewTxPublisher(pgx.Tx(nil))", func() error {
			_, err := outbox.NewTxPublisher(pgx.Tx(nil), outbox.PublisherConfig{}, nil)
			return err
		})
		e.fails("NewTxPublisher((*sql.Tx)(nil))", func() error {
			_, err := outbox.NewTxPublisher((*sql.Tx)(nil), outbox.PublisherConfig{}, nil)
			return err
		})
	}},
	{"outbox.Publisher.Publish", func(e *env) {
		pub := must(outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true}, nil))(e)
		noDB := must(outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema}, nil))(e)
		for _, msgs := range nilMsgs {
			e.may(fmt.Sprintf("Publisher.Publish(orders, %v)", msgs), func() error { return pub.Publish("orders", msgs...) })
			e.may(fmt.Sprintf("Publisher.Publish(\"\", %v)", msgs), func() error { return pub.Publish("", msgs...) })
			e.may(fmt.Sprintf("Publisher(no DB).Publish(orders, %v)", msgs), func() error { return noDB.Publish("orders", msgs...) })
			e.may(fmt.Sprintf("Publisher{}.Publish(orders, %v)", msgs), func() error { return new(outbox.Publisher).Publish("orders", msgs...) })
		}
		e.fails("Publisher.Publish(orders, nil msg)", func() error { return pub.Publish("orders", nil) })
		nilPart := must(outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true, Partitioner: partitioning.PartitionerFunc(nil)}, nil))(e)
		e.fails("Publisher(Partitioner: PartitionerFunc(nil)).Publish(orders, keyed msg)", func() error {
			m := message.NewMessage("u", nil)
			m.Metadata.Set(outbox.PartitionKeyMetadata, "k")
			return nilPart.Publish("orders", m)
		})
		e.fails("Publisher(no DB).Publish(orders, msg)", func() error { return noDB.Publish("orders", message.NewMessage("u", nil)) })
		e.fails("Publisher{}.Publish(orders, msg)", func() error { return new(outbox.Publisher).Publish("orders", message.NewMessage("u", nil)) })
	}},
	{"outbox.Publisher.Close", func(e *env) {
		e.may("Publisher{}.Close", func() error { return new(outbox.Publisher).Close() })
	}},
	{"outbox.SequencerConfig.Validate", func(e *env) {
		e.fails("SequencerConfig{}.Validate", func() error { return outbox.SequencerConfig{}.Validate() })
	}},
	{"outbox.NewSequencer", func(e *env) {
		e.fails("NewSequencer(zero, nil)", func() error { _, err := outbox.NewSequencer(outbox.SequencerConfig{}, nil); return err })
	}},
	{"outbox.Sequencer.Stats", func(e *env) {
		e.call("Sequencer{}.Stats", func() { new(outbox.Sequencer).Stats() })
	}},
	{"outbox.Sequencer.Run", func(e *env) {
		s := must(outbox.NewSequencer(outbox.SequencerConfig{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Sequencer.Run(ended ctx)", func() error { return s.Run(e.done) })
		e.fails("Sequencer{}.Run", func() error { return new(outbox.Sequencer).Run(e.done) })
	}},
	{"outbox.Sequencer.Close", func(e *env) {
		e.may("Sequencer{}.Close", func() error { return new(outbox.Sequencer).Close() })
	}},
	{"outbox.Sequencer.SequenceAll", func(e *env) {
		e.fails("Sequencer{}.SequenceAll", func() error { _, err := new(outbox.Sequencer).SequenceAll(e.ctx); return err })
	}},
	{"outbox.Sequencer.Pass", func(e *env) {
		e.fails("Sequencer{}.Pass", func() error { _, _, err := new(outbox.Sequencer).Pass(e.ctx); return err })
	}},
	{"outbox.Strategy.String", func(e *env) { e.call("Strategy(0).String", func() { _ = outbox.Strategy(0).String() }) }},
	{"outbox.SubscriberConfig.Validate", func(e *env) {
		e.fails("SubscriberConfig{}.Validate", func() error { return outbox.SubscriberConfig{}.Validate() })
		e.fails("SubscriberConfig{RejectHandler: RejectHandlerFunc(nil)}.Validate", func() error {
			cfg := subCfg(e)
			cfg.RejectHandler = outbox.RejectHandlerFunc(nil)
			return cfg.Validate()
		})
	}},
	{"outbox.NewSubscriber", func(e *env) {
		e.fails("NewSubscriber(zero, nil)", func() error { _, err := outbox.NewSubscriber(outbox.SubscriberConfig{}, nil); return err })
	}},
	{"outbox.Subscriber.SubscribeInitialize", func(e *env) {
		s := must(outbox.NewSubscriber(subCfg(e), nil))(e)
		defer s.Close()
		e.fails("Subscriber.SubscribeInitialize(\"\")", func() error { return s.SubscribeInitialize("") })
		e.fails("Subscriber{}.SubscribeInitialize(orders)", func() error { return new(outbox.Subscriber).SubscribeInitialize("orders") })
	}},
	{"outbox.Subscriber.Subscribe", func(e *env) {
		e.fails("Subscriber{}.Subscribe(orders)", func() error { _, err := new(outbox.Subscriber).Subscribe(e.done, "orders"); return err })
	}},
	{"outbox.Subscriber.ConsumeBatches", func(e *env) {
		s := must(outbox.NewSubscriber(subCfg(e), nil))(e)
		defer s.Close()
		e.fails("Subscriber.ConsumeBatches(orders, nil)", func() error { return s.ConsumeBatches(e.done, "orders", nil) })
		e.fails("Subscriber{}.ConsumeBatches(orders, nil)", func() error { return new(outbox.Subscriber).ConsumeBatches(e.done, "orders", nil) })
	}},
	{"outbox.Subscriber.Subscription", func(e *env) {
		s := must(outbox.NewSubscriber(subCfg(e), nil))(e)
		defer s.Close()
		e.fails("Subscription(\"\", nil, nil)", func() error { _, err := s.Subscription(e.done, "", nil, nil); return err })
		e.fails("Subscriber{}.Subscription(orders, nil, nil)", func() error {
			_, err := new(outbox.Subscriber).Subscription(e.done, "orders", nil, nil)
			return err
		})
	}},
	{"outbox.Subscriber.Close", func(e *env) {
		e.may("Subscriber{}.Close", func() error { return new(outbox.Subscriber).Close() })
	}},
	{"outbox.Subscriber.Stats", func(e *env) {
		e.call("Subscriber{}.Stats", func() { new(outbox.Subscriber).Stats() })
	}},
	{"outbox.RegisterTopic", func(e *env) {
		nilDBs(e, "RegisterTopic", func(db any) error {
			switch d := db.(type) {
			case *pgxpool.Pool:
				return outbox.RegisterTopic(e.ctx, d, "", "orders", 1)
			case *pgx.Conn:
				return outbox.RegisterTopic(e.ctx, d, "", "orders", 1)
			case *sql.DB:
				return outbox.RegisterTopic(e.ctx, d, "", "orders", 1)
			default:
				return outbox.RegisterTopic(e.ctx, db.(*sql.Conn), "", "orders", 1)
			}
		})
		e.fails("RegisterTopic(pool, \"\", \"\", 0)", func() error { return outbox.RegisterTopic(e.ctx, e.pool, e.schema, "", 0) })
	}},
	{"outbox.TopicPartitions", func(e *env) {
		e.fails("TopicPartitions(nil pool)", func() error {
			_, err := outbox.TopicPartitions(e.ctx, (*pgxpool.Pool)(nil), "", "orders")
			return err
		})
		e.fails("TopicPartitions(nil *sql.DB)", func() error {
			_, err := outbox.TopicPartitions(e.ctx, (*sql.DB)(nil), "", "orders")
			return err
		})
	}},
	{"outbox.ConfigureTracing", func(e *env) {
		e.call("ConfigureTracing(nil, nil)", func() { outbox.ConfigureTracing(nil, nil) })
	}},

	// ---- package adaptive
	{"adaptive.Tuning.Validate", func(e *env) {
		e.may("Tuning{}.Validate", func() error { return adaptive.Tuning{}.Validate() })
	}},
	{"adaptive.Tuning.WithDefaults", func(e *env) {
		e.call("Tuning{}.WithDefaults", func() { _ = adaptive.Tuning{}.WithDefaults() })
		e.call("Tuning{-1...}.WithDefaults", func() {
			_ = adaptive.Tuning{BatchSize: -1, BackoffBase: -1, BackoffMax: -1, LeaseTTL: -1}.WithDefaults()
		})
	}},
	{"adaptive.Tuning.ProfileName", func(e *env) { e.call("Tuning{}.ProfileName", func() { _ = adaptive.Tuning{}.ProfileName() }) }},
	{"adaptive.Default", func(e *env) { e.call("Default", func() { _ = adaptive.Default() }) }},
	{"adaptive.LowLatency", func(e *env) { e.call("LowLatency", func() { _ = adaptive.LowLatency() }) }},
	{"adaptive.HighThroughput", func(e *env) { e.call("HighThroughput", func() { _ = adaptive.HighThroughput() }) }},
	{"adaptive.Relaxed", func(e *env) { e.call("Relaxed", func() { _ = adaptive.Relaxed() }) }},
	{"adaptive.ProfileNames", func(e *env) { e.call("ProfileNames", func() { adaptive.ProfileNames() }) }},
	{"adaptive.Profile", func(e *env) {
		e.fails("Profile(\"\")", func() error { _, err := adaptive.Profile(""); return err })
	}},

	// ---- package admin
	{"admin.GroupActiveError.Error", func(e *env) {
		e.call("GroupActiveError{}.Error", func() { _ = new(admin.GroupActiveError).Error() })
	}},
	{"admin.GroupActiveError.Is", func(e *env) {
		e.call("GroupActiveError{}.Is(nil)", func() { _ = new(admin.GroupActiveError).Is(nil) })
	}},
	{"admin.SeqRangeError.Error", func(e *env) {
		e.call("SeqRangeError{}.Error", func() { _ = new(admin.SeqRangeError).Error() })
	}},
	{"admin.SeqRangeError.Is", func(e *env) {
		e.call("SeqRangeError{}.Is(nil)", func() { _ = new(admin.SeqRangeError).Is(nil) })
	}},
	{"admin.Config.Validate", func(e *env) {
		e.fails("admin.Config{}.Validate", func() error { return admin.Config{}.Validate() })
	}},
	{"admin.New", func(e *env) {
		e.fails("admin.New(zero, nil)", func() error { _, err := admin.New(admin.Config{}, nil); return err })
	}},
	{"admin.Admin.Pause", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.Pause(Scope{})", func() error { _, err := a.Pause(e.ctx, admin.Scope{}); return err })
		e.fails("Admin{}.Pause(Scope{Group})", func() error { _, err := new(admin.Admin).Pause(e.ctx, admin.Scope{Group: "g"}); return err })
	}},
	{"admin.Admin.Resume", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.Resume(Scope{})", func() error { _, err := a.Resume(e.ctx, admin.Scope{}); return err })
		e.fails("Admin{}.Resume(Scope{Group})", func() error { _, err := new(admin.Admin).Resume(e.ctx, admin.Scope{Group: "g"}); return err })
	}},
	{"admin.ToSeq", func(e *env) { e.call("ToSeq(0)", func() { _ = admin.ToSeq(0) }) }},
	{"admin.ToTime", func(e *env) { e.call("ToTime(zero)", func() { admin.ToTime(time.Time{}) }) }},
	{"admin.Admin.ResetCursor", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.ResetCursor(Scope{}, Position{})", func() error { _, err := a.ResetCursor(e.ctx, admin.Scope{}, admin.Position{}); return err })
		e.fails("Admin{}.ResetCursor", func() error {
			_, err := new(admin.Admin).ResetCursor(e.ctx, admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0))
			return err
		})
	}},
	{"admin.Admin.DeleteGroup", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.DeleteGroup(\"\", zero)", func() error { _, err := a.DeleteGroup(e.ctx, "", admin.DeleteGroupOptions{}); return err })
		e.fails("Admin{}.DeleteGroup(g)", func() error {
			_, err := new(admin.Admin).DeleteGroup(e.ctx, "g", admin.DeleteGroupOptions{})
			return err
		})
	}},
	{"admin.Admin.RetryHeldNow", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.RetryHeldNow(HeldRef{})", func() error { _, err := a.RetryHeldNow(e.ctx, admin.HeldRef{}); return err })
		e.fails("Admin{}.RetryHeldNow", func() error {
			_, err := new(admin.Admin).RetryHeldNow(e.ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "k"})
			return err
		})
	}},
	{"admin.Admin.DeadLetterHeld", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.DeadLetterHeld(HeldRef{})", func() error { _, err := a.DeadLetterHeld(e.ctx, admin.HeldRef{}); return err })
		e.fails("Admin{}.DeadLetterHeld", func() error {
			_, err := new(admin.Admin).DeadLetterHeld(e.ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "k"})
			return err
		})
	}},
	{"admin.Admin.Exists", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Admin.Exists(Filter{})", func() error { return a.Exists(e.ctx, admin.Filter{}) })
		e.fails("Admin{}.Exists(Filter{Group})", func() error { return new(admin.Admin).Exists(e.ctx, admin.Filter{Group: "g"}) })
	}},
	{"admin.NotFoundError.Error", func(e *env) { e.call("NotFoundError{}.Error", func() { _ = new(admin.NotFoundError).Error() }) }},
	{"admin.NotFoundError.Is", func(e *env) { e.call("NotFoundError{}.Is(nil)", func() { _ = new(admin.NotFoundError).Is(nil) }) }},
	{"admin.PartitionStatus.LagAge", func(e *env) {
		e.call("PartitionStatus{}.LagAge", func() { admin.PartitionStatus{}.LagAge() })
	}},
	{"admin.Admin.Status", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Admin.Status(Filter{})", func() error { _, err := a.Status(e.ctx, admin.Filter{}); return err })
		e.fails("Admin{}.Status", func() error { _, err := new(admin.Admin).Status(e.ctx, admin.Filter{}); return err })
	}},

	// ---- package console
	{"console.Config.Validate", func(e *env) {
		e.fails("console.Config{}.Validate", func() error { return console.Config{}.Validate() })
	}},
	{"console.New", func(e *env) {
		e.fails("console.New(zero, nil)", func() error { _, err := console.New(console.Config{}, nil); return err })
	}},
	{"console.ListenHosts", func(e *env) {
		e.call("ListenHosts(\"\")", func() { _ = console.ListenHosts("") })
		e.call("ListenHosts(\":\")", func() { _ = console.ListenHosts(":") })
	}},
	{"console.Console.ServeHTTP", func(e *env) {
		c := must(console.New(console.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		e.call("Console.ServeHTTP(nil, nil)", func() { c.ServeHTTP(nil, nil) })
		e.call("Console.ServeHTTP(w, nil)", func() { c.ServeHTTP(httptest.NewRecorder(), nil) })
		e.call("Console.ServeHTTP(nil, req)", func() { c.ServeHTTP(nil, req) })
		e.call("Console{}.ServeHTTP(w, req)", func() { new(console.Console).ServeHTTP(httptest.NewRecorder(), req) })
	}},

	// ---- package deadletter
	{"deadletter.StateError.Error", func(e *env) { e.call("StateError{}.Error", func() { _ = new(deadletter.StateError).Error() }) }},
	{"deadletter.StateError.Is", func(e *env) { e.call("StateError{}.Is(nil)", func() { _ = new(deadletter.StateError).Is(nil) }) }},
	{"deadletter.Store.List", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.List(zero)", func() error { _, err := s.List(e.ctx, deadletter.ListOptions{}); return err })
		e.fails("Store{}.List", func() error { _, err := new(deadletter.Store).List(e.ctx, deadletter.ListOptions{}); return err })
	}},
	{"deadletter.Store.Count", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Count(zero)", func() error { _, err := s.Count(e.ctx, deadletter.Filter{}); return err })
		e.fails("Store{}.Count", func() error { _, err := new(deadletter.Store).Count(e.ctx, deadletter.Filter{}); return err })
	}},
	{"deadletter.Store.Get", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Get(0)", func() error { _, err := s.Get(e.ctx, 0); return err })
		e.fails("Store{}.Get(1)", func() error { _, err := new(deadletter.Store).Get(e.ctx, 1); return err })
	}},
	{"deadletter.Store.Replay", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Replay(0, zero)", func() error { _, err := s.Replay(e.ctx, 0, deadletter.ReplayOptions{}); return err })
		e.fails("Store{}.Replay(1)", func() error { _, err := new(deadletter.Store).Replay(e.ctx, 1, deadletter.ReplayOptions{}); return err })
	}},
	{"deadletter.Store.Discard", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Discard(0)", func() error { _, err := s.Discard(e.ctx, 0); return err })
		e.fails("Store{}.Discard(1)", func() error { _, err := new(deadletter.Store).Discard(e.ctx, 1); return err })
	}},
	{"deadletter.Store.Purge", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Purge(zero)", func() error { _, err := s.Purge(e.ctx, deadletter.PurgeOptions{}); return err })
		e.fails("Store{}.Purge", func() error { _, err := new(deadletter.Store).Purge(e.ctx, deadletter.PurgeOptions{}); return err })
	}},
	{"deadletter.Store.PlanPurge", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.PlanPurge(zero)", func() error { _, err := s.PlanPurge(e.ctx, deadletter.PurgeOptions{}); return err })
		e.fails("Store{}.PlanPurge", func() error { _, err := new(deadletter.Store).PlanPurge(e.ctx, deadletter.PurgeOptions{}); return err })
	}},
	{"deadletter.PurgePlan.Deleted", func(e *env) { e.call("PurgePlan{}.Deleted", func() { deadletter.PurgePlan{}.Deleted() }) }},
	{"deadletter.Store.PoisonPublisher", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		pp := s.PoisonPublisher()
		for _, msgs := range nilMsgs {
			e.may(fmt.Sprintf("Store.PoisonPublisher().Publish(orders, %v)", msgs), func() error { return pp.Publish("orders", msgs...) })
		}
		e.call("Store{}.PoisonPublisher().Publish(orders, msg)", func() {
			_ = new(deadletter.Store).PoisonPublisher().Publish("orders", message.NewMessage("u", nil))
		})
	}},
	{"deadletter.Config.Validate", func(e *env) {
		e.fails("deadletter.Config{}.Validate", func() error { return deadletter.Config{}.Validate() })
	}},
	{"deadletter.NewStore", func(e *env) {
		e.fails("NewStore(zero, nil)", func() error { _, err := deadletter.NewStore(deadletter.Config{}, nil); return err })
	}},
	{"deadletter.Store.HandleReject", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.HandleReject(nil tx, zero)", func() error { return s.HandleReject(e.ctx, nil, outbox.RejectedMessage{}) })
		e.fails("Store{}.HandleReject(nil tx, zero)", func() error {
			return new(deadletter.Store).HandleReject(e.ctx, nil, outbox.RejectedMessage{})
		})
		tx := must(e.pool.Begin(e.ctx))(e)
		defer tx.Rollback(e.ctx)
		e.may("Store.HandleReject(tx, zero)", func() error { return s.HandleReject(e.ctx, tx, outbox.RejectedMessage{}) })
	}},
	{"deadletter.Store.Add", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Add(zero)", func() error { _, err := s.Add(e.ctx, outbox.RejectedMessage{}); return err })
		e.fails("Store{}.Add", func() error { _, err := new(deadletter.Store).Add(e.ctx, outbox.RejectedMessage{}); return err })
	}},

	// ---- package forwarder
	{"forwarder.TargetFunc.Send", func(e *env) {
		e.fails("TargetFunc(nil).Send", func() error { _, err := forwarder.TargetFunc(nil).Send(e.ctx, "orders", nil); return err })
	}},
	{"forwarder.Config.Validate", func(e *env) {
		e.fails("forwarder.Config{}.Validate", func() error { return forwarder.Config{}.Validate() })
		e.fails("forwarder.Config{Target: TargetFunc(nil)}.Validate", func() error {
			return forwarder.Config{Subscriber: subCfg(e), Topics: []string{"orders"}, Target: forwarder.TargetFunc(nil)}.Validate()
		})
		e.fails("forwarder.Config{Topics: [\"\"]}.Validate", func() error {
			return forwarder.Config{Subscriber: subCfg(e), Topics: []string{""}, Target: sendTarget}.Validate()
		})
		e.fails("forwarder.Config{Middlewares: [nil]}.Validate", func() error {
			return forwarder.Config{Subscriber: subCfg(e), Topics: []string{"orders"}, Target: sendTarget, Middlewares: []message.HandlerMiddleware{nil}}.Validate()
		})
	}},
	{"forwarder.NewForwarder", func(e *env) {
		e.fails("NewForwarder(zero, nil)", func() error { _, err := forwarder.NewForwarder(forwarder.Config{}, nil); return err })
		e.fails("NewForwarder(Middlewares: [nil])", func() error {
			_, err := forwarder.NewForwarder(forwarder.Config{Subscriber: subCfg(e), Topics: []string{"orders"}, Target: sendTarget, Middlewares: []message.HandlerMiddleware{nil}}, nil)
			return err
		})
	}},
	{"forwarder.Forwarder.Run", func(e *env) {
		f := newForwarder(e)
		e.may("Forwarder.Run(ended ctx)", func() error { return f.Run(e.done) })
		e.fails("Forwarder{}.Run", func() error { return new(forwarder.Forwarder).Run(e.done) })
	}},
	{"forwarder.Forwarder.Close", func(e *env) {
		e.may("Forwarder{}.Close", func() error { return new(forwarder.Forwarder).Close() })
	}},
	{"forwarder.Forwarder.Stats", func(e *env) { e.call("Forwarder{}.Stats", func() { new(forwarder.Forwarder).Stats() }) }},
	{"forwarder.Forwarder.Consumer", func(e *env) {
		f := newForwarder(e)
		e.fails("Forwarder.Consumer(\"\")", func() error { _, _, err := f.Consumer(e.ctx, ""); return err })
		e.fails("Forwarder{}.Consumer(orders)", func() error { _, _, err := new(forwarder.Forwarder).Consumer(e.ctx, "orders"); return err })
		_, h, err := f.Consumer(e.ctx, "orders")
		if err != nil {
			e.t.Fatal(err)
		}
		e.may("Forwarder.Consumer's handler(nil)", func() error { _, err := h(e.ctx, nil); return err })
		e.may("Forwarder.Consumer's handler([nil])", func() error { _, err := h(e.ctx, []*message.Message{nil}); return err })
	}},
	// ---- package forwarder/jetstream
	{"jetstream.Config.Validate", func(e *env) {
		e.fails("jetstream.Config{}.Validate", func() error { return jetstream.Config{}.Validate() })
	}},
	{"jetstream.NewTarget", func(e *env) {
		e.fails("jetstream.NewTarget(zero, nil)", func() error { _, err := jetstream.NewTarget(jetstream.Config{}, nil); return err })
	}},
	{"jetstream.Target.Close", func(e *env) {
		e.may("jetstream.Target{}.Close", func() error { return new(jetstream.Target).Close() })
	}},
	{"jetstream.Target.JetStream", func(e *env) {
		e.call("jetstream.Target{}.JetStream", func() { new(jetstream.Target).JetStream() })
	}},
	{"jetstream.Target.Send", func(e *env) {
		t := must(jetstream.NewTarget(jetstream.Config{URL: startNATS(e), AckTimeout: time.Second}, nil))(e)
		defer t.Close()
		e.may("jetstream.Target.Send(orders, nil)", func() error { _, err := t.Send(e.ctx, "orders", nil); return err })
		e.fails("jetstream.Target.Send(orders, [nil])", func() error { _, err := t.Send(e.ctx, "orders", []*message.Message{nil}); return err })
		e.fails("jetstream.Target{}.Send(orders, [msg])", func() error {
			_, err := new(jetstream.Target).Send(e.ctx, "orders", []*message.Message{message.NewMessage("u", nil)})
			return err
		})
	}},
	// ---- package forwarder/kafka
	{"kafka.Config.Validate", func(e *env) {
		e.fails("kafka.Config{}.Validate", func() error { return kafka.Config{}.Validate() })
		e.fails("kafka.Config{Brokers: [\"\"]}.Validate", func() error { return kafka.Config{Brokers: []string{""}}.Validate() })
		e.fails("kafka.Config{ClientOptions: [nil]}.Validate", func() error {
			return kafka.Config{Brokers: []string{"localhost:9092"}, ClientOptions: []kgo.Opt{nil}}.Validate()
		})
	}},
	{"kafka.NewTarget", func(e *env) {
		e.fails("kafka.NewTarget(zero, nil)", func() error { _, err := kafka.NewTarget(kafka.Config{}, nil); return err })
	}},
	{"kafka.Target.Close", func(e *env) {
		e.may("kafka.Target{}.Close", func() error { return new(kafka.Target).Close() })
		e.may("(*kafka.Target)(nil).Close", func() error { return (*kafka.Target)(nil).Close() })
	}},
	{"kafka.Target.Send", func(e *env) {
		for _, atLeastOnce := range []bool{false, true} {
			t := must(kafka.NewTarget(kafka.Config{Brokers: startKafka(e), AtLeastOnce: atLeastOnce, ClientOptions: []kgo.Opt{kgo.DialTimeout(time.Second)}}, nil))(e)
			e.may("kafka.Target.Send(orders, nil)", func() error { _, err := t.Send(e.ctx, "orders", nil); return err })
			e.fails("kafka.Target.Send(orders, [nil])", func() error { _, err := t.Send(e.ctx, "orders", []*message.Message{nil}); return err })
			send := func() error {
				_, err := t.Send(e.ctx, "orders", []*message.Message{message.NewMessage("u", nil)})
				return err
			}
			if atLeastOnce {
				e.may("kafka.Target{AtLeastOnce}.Send(orders, [msg])", send)
			} else {
				// Exactly once needs the outbox metadata a forwarder's batches carry.
				e.fails("kafka.Target.Send(orders, [msg without outbox metadata])", send)
			}
			e.may("kafka.Target.Close", t.Close)
		}
		e.fails("kafka.Target{}.Send(orders, [msg])", func() error {
			_, err := new(kafka.Target).Send(e.ctx, "orders", []*message.Message{message.NewMessage("u", nil)})
			return err
		})
	}},
	{"kafka.Target.CheckKeyIsolation", func(e *env) {
		e.may("kafka.Target{}.CheckKeyIsolation", func() error { return new(kafka.Target).CheckKeyIsolation() })
		e.may("(*kafka.Target)(nil).CheckKeyIsolation", func() error { return (*kafka.Target)(nil).CheckKeyIsolation() })
	}},
	{"kafka.Target.OpenProducers", func(e *env) {
		e.call("kafka.Target{}.OpenProducers", func() { new(kafka.Target).OpenProducers() })
		e.call("(*kafka.Target)(nil).OpenProducers", func() { (*kafka.Target)(nil).OpenProducers() })
	}},
	{"kafka.Partitioner", func(e *env) { e.call("kafka.Partitioner()", func() { kafka.Partitioner() }) }},
	{"kafka.DefaultMarshaler.Marshal", func(e *env) {
		e.fails("kafka.DefaultMarshaler.Marshal(orders, nil)", func() error { _, err := kafka.DefaultMarshaler{}.Marshal("orders", nil); return err })
		e.may("kafka.DefaultMarshaler.Marshal(\"\", msg)", func() error {
			_, err := kafka.DefaultMarshaler{}.Marshal("", message.NewMessage("", nil))
			return err
		})
	}},
	{"forwarder.PartitionKey", func(e *env) { e.call("PartitionKey(nil)", func() { forwarder.PartitionKey(nil) }) }},
	{"forwarder.Outgoing", func(e *env) { e.call("Outgoing(nil)", func() { forwarder.Outgoing(nil) }) }},
	{"forwarder.NewPublisherTarget", func(e *env) {
		e.call("NewPublisherTarget(nil, nil)", func() { forwarder.NewPublisherTarget(nil, nil) })
	}},
	{"forwarder.PublisherTarget.Send", func(e *env) {
		e.fails("NewPublisherTarget(nil, nil).Send(orders, [msg])", func() error {
			_, err := forwarder.NewPublisherTarget(nil, nil).Send(e.ctx, "orders", []*message.Message{message.NewMessage("u", nil)})
			return err
		})
		e.fails("PublisherTarget{}.Send(orders, [msg])", func() error {
			_, err := new(forwarder.PublisherTarget).Send(e.ctx, "orders", []*message.Message{message.NewMessage("u", nil)})
			return err
		})
		pub := must(outbox.NewPublisher(outbox.PublisherConfig{Schema: e.schema, DB: e.pool, OwnTransaction: true}, nil))(e)
		t := forwarder.NewPublisherTarget(pub, nil)
		e.may("PublisherTarget.Send(orders, nil)", func() error { _, err := t.Send(e.ctx, "orders", nil); return err })
		e.fails("PublisherTarget.Send(orders, [nil])", func() error { _, err := t.Send(e.ctx, "orders", []*message.Message{nil}); return err })
	}},

	// ---- package inbox
	{"inbox.StaleError.Error", func(e *env) { e.call("StaleError{}.Error", func() { _ = new(inbox.StaleError).Error() }) }},
	{"inbox.StaleError.Is", func(e *env) { e.call("StaleError{}.Is(nil)", func() { _ = new(inbox.StaleError).Is(nil) }) }},
	{"inbox.New", func(e *env) {
		e.fails("inbox.New(zero)", func() error { _, err := inbox.New(inbox.Config{}); return err })
	}},
	{"inbox.Migrate", func(e *env) {
		e.fails("inbox.Migrate(nil pool)", func() error { return inbox.Migrate(e.ctx, nil, "") })
	}},
	{"inbox.Inbox.Stats", func(e *env) { e.call("Inbox{}.Stats", func() { new(inbox.Inbox).Stats() }) }},
	{"inbox.Inbox.Process", func(e *env) {
		schema := e.schema + "_inbox"
		if err := inbox.Migrate(e.ctx, e.pool, schema); err != nil {
			e.t.Fatal(err)
		}
		in := must(inbox.New(inbox.Config{Pool: e.pool, Schema: schema, Consumer: "c"}))(e)
		pass := must(inbox.New(inbox.Config{Pool: e.pool, Schema: schema, Consumer: "c", WithoutPosition: inbox.PassThrough}))(e)
		fn := func(context.Context, pgx.Tx) error { return nil }
		msg := message.NewMessage("u", nil)
		for _, c := range []struct {
			name string
			in   *inbox.Inbox
		}{{"Inbox", in}, {"Inbox(PassThrough)", pass}, {"Inbox{}", new(inbox.Inbox)}} {
			name, in := c.name, c.in
			e.fails(name+".Process(nil, nil, nil)", func() error { _, err := in.Process(e.ctx, nil, nil, nil); return err })
			tx := must(e.pool.Begin(e.ctx))(e)
			e.fails(name+".Process(tx, nil, fn)", func() error { _, err := in.Process(e.ctx, tx, nil, fn); return err })
			e.fails(name+".Process(tx, msg, nil)", func() error { _, err := in.Process(e.ctx, tx, msg, nil); return err })
			_ = tx.Rollback(e.ctx)
		}
	}},
	{"inbox.Inbox.Middleware", func(e *env) {
		in := must(inbox.New(inbox.Config{Pool: e.pool, Schema: e.schema + "_inbox", Consumer: "c"}))(e)
		noPool := must(inbox.New(inbox.Config{Consumer: "c"}))(e)
		h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
		for name, in := range map[string]*inbox.Inbox{"Inbox": in, "Inbox(no Pool)": noPool, "Inbox{}": new(inbox.Inbox)} {
			e.fails(name+".Middleware(nil)(msg)", func() error { _, err := in.Middleware(nil)(message.NewMessage("u", nil)); return err })
			e.fails(name+".Middleware(h)(nil)", func() error { _, err := in.Middleware(h)(nil); return err })
		}
	}},

	// ---- package metrics
	{"metrics.NewCollector", func(e *env) {
		e.fails("NewCollector(zero)", func() error { _, err := metrics.NewCollector(metrics.CollectorConfig{}); return err })
	}},
	{"metrics.Collector.Describe", func(e *env) {
		c := must(metrics.NewCollector(metrics.CollectorConfig{Pool: e.pool, Schema: e.schema}))(e)
		e.call("Collector.Describe(nil)", func() { c.Describe(nil) })
		e.call("Collector{}.Describe(ch)", func() {
			ch := make(chan *prometheus.Desc, 1000)
			new(metrics.Collector).Describe(ch)
		})
	}},
	{"metrics.Collector.Collect", func(e *env) {
		c := must(metrics.NewCollector(metrics.CollectorConfig{Pool: e.pool, Schema: e.schema}))(e)
		e.call("Collector.Collect(nil)", func() { c.Collect(nil) })
		e.call("Collector{}.Collect(ch)", func() {
			ch := make(chan prometheus.Metric, 1000)
			new(metrics.Collector).Collect(ch)
		})
	}},
	{"metrics.Config.Validate", func(e *env) {
		e.may("metrics.Config{}.Validate", func() error { return metrics.Config{}.Validate() })
	}},
	{"metrics.Enable", func(e *env) {
		var m *metrics.Metrics
		e.may("metrics.Enable(Registerer: new registry)", func() error {
			var err error
			m, err = metrics.Enable(metrics.Config{Registerer: prometheus.NewRegistry()})
			return err
		})
		if m != nil {
			e.call("Metrics.Disable", func() { m.Disable() })
		}
	}},
	{"metrics.Metrics.Disable", func(e *env) {
		e.call("Metrics{}.Disable", func() { new(metrics.Metrics).Disable() })
	}},

	// ---- package outboxtest
	{"outboxtest.InSchema", func(e *env) { e.call("InSchema(\"\")", func() { outboxtest.InSchema("") }) }},
	{"outboxtest.Key", func(e *env) { e.call("Key(\"\")", func() { outboxtest.Key("") }) }},
	{"outboxtest.UUID", func(e *env) { e.call("UUID(\"\")", func() { outboxtest.UUID("") }) }},
	{"outboxtest.Metadata", func(e *env) { e.call("Metadata(\"\", \"\")", func() { outboxtest.Metadata("", "") }) }},
	{"outboxtest.Payload", func(e *env) { requireWith(e, "Payload(\"\", nil)", outboxtest.Payload("", nil)) }},
	{"outboxtest.PayloadEquals", func(e *env) { requireWith(e, "PayloadEquals(nil)", outboxtest.PayloadEquals(nil)) }},
	{"outboxtest.JSON", func(e *env) { requireWith(e, "JSON(nil)", outboxtest.JSON(nil)) }},
	{"outboxtest.Where", func(e *env) { requireWith(e, "Where(\"\", nil)", outboxtest.Where("", nil)) }},
	{"outboxtest.Times", func(e *env) { requireWith(e, "Times(-1)", outboxtest.Times(-1)) }},
	{"outboxtest.RequirePublished", func(e *env) {
		for _, db := range []any{nil, (*pgxpool.Pool)(nil), (*sql.DB)(nil), e.pool} {
			e.call(fmt.Sprintf("RequirePublished(%T, \"\", nil)", db), func() { outboxtest.RequirePublished(&fakeTB{}, db, "", nil) })
		}
	}},
	{"outboxtest.RequirePublishedTx", func(e *env) {
		for _, tx := range []any{nil, pgx.Tx(nil), (*sql.Tx)(nil)} {
			e.call(fmt.Sprintf("RequirePublishedTx(%T, \"\", nil)", tx), func() { outboxtest.RequirePublishedTx(&fakeTB{}, tx, "", nil) })
		}
	}},
	{"outboxtest.RequireNotPublished", func(e *env) {
		for _, db := range []any{nil, (*pgxpool.Pool)(nil), e.pool} {
			e.call(fmt.Sprintf("RequireNotPublished(%T, \"\", nil)", db), func() { outboxtest.RequireNotPublished(&fakeTB{}, db, "", nil) })
		}
	}},
	{"outboxtest.Result.Handled", func(e *env) { e.call("Result{}.Handled", func() { _ = outboxtest.Result{}.Handled() }) }},
	{"outboxtest.NewRunner", func(e *env) {
		e.fails("NewRunner(zero, \"\", nil)", func() error { _, err := outboxtest.NewRunner(e.ctx, outbox.SubscriberConfig{}, "", nil); return err })
		e.fails("NewRunner(zero, orders, h)", func() error {
			_, err := outboxtest.NewRunner(e.ctx, outbox.SubscriberConfig{}, "orders", handler)
			return err
		})
	}},
	{"outboxtest.NewBatchRunner", func(e *env) {
		e.fails("NewBatchRunner(zero, \"\", nil)", func() error {
			_, err := outboxtest.NewBatchRunner(e.ctx, outbox.SubscriberConfig{}, "", nil)
			return err
		})
	}},
	{"outboxtest.Runner.Tick", func(e *env) {
		e.fails("Runner{}.Tick", func() error { _, err := new(outboxtest.Runner).Tick(e.ctx); return err })
	}},
	{"outboxtest.Runner.RunUntilIdle", func(e *env) {
		e.fails("Runner{}.RunUntilIdle", func() error { _, err := new(outboxtest.Runner).RunUntilIdle(e.ctx); return err })
	}},
	{"outboxtest.Runner.Close", func(e *env) {
		e.may("Runner{}.Close", func() error { return new(outboxtest.Runner).Close() })
	}},
	{"outboxtest.RunUntilIdle", func(e *env) {
		e.fails("RunUntilIdle(zero, \"\", nil)", func() error { _, err := outboxtest.RunUntilIdle(e.ctx, outbox.SubscriberConfig{}, "", nil); return err })
		e.fails("RunUntilIdle(cfg, orders, nil)", func() error { _, err := outboxtest.RunUntilIdle(e.ctx, subCfg(e), "orders", nil); return err })
	}},
	{"outboxtest.Schema", func(e *env) {
		e.call("Schema(t, nil pool)", func() { outboxtest.Schema(&fakeTB{}, (*pgxpool.Pool)(nil)) })
		e.call("Schema(t, nil *sql.DB)", func() { outboxtest.Schema(&fakeTB{}, (*sql.DB)(nil)) })
	}},

	// ---- package partitioning
	{"partitioning.Murmur2.Partition", func(e *env) {
		e.fails("Murmur2{}.Partition(\"\", 0)", func() error { _, err := partitioning.Murmur2{}.Partition("", 0); return err })
	}},
	{"partitioning.Murmur2Hash", func(e *env) { e.call("Murmur2Hash(nil)", func() { partitioning.Murmur2Hash(nil) }) }},
	{"partitioning.PartitionCountError.Error", func(e *env) {
		e.call("PartitionCountError{}.Error", func() { _ = new(partitioning.PartitionCountError).Error() })
	}},
	{"partitioning.PartitionCountError.Is", func(e *env) {
		e.call("PartitionCountError{}.Is(nil)", func() { _ = new(partitioning.PartitionCountError).Is(nil) })
	}},
	{"partitioning.ValidatePartitions", func(e *env) {
		e.fails("ValidatePartitions(0)", func() error { return partitioning.ValidatePartitions(0) })
	}},
	{"partitioning.PartitionerFunc.Partition", func(e *env) {
		e.fails("PartitionerFunc(nil).Partition(\"\", 1)", func() error { _, err := partitioning.PartitionerFunc(nil).Partition("", 1); return err })
	}},
	{"partitioning.Default", func(e *env) { e.call("Default", func() { partitioning.Default() }) }},

	// ---- package relay
	{"relay.Config.Validate", func(e *env) {
		e.fails("relay.Config{}.Validate", func() error { return relay.Config{}.Validate() })
	}},
	{"relay.DefaultInstance", func(e *env) { e.call("DefaultInstance", func() { relay.DefaultInstance() }) }},
	{"relay.SlotInUseError.Error", func(e *env) { e.call("SlotInUseError{}.Error", func() { _ = new(relay.SlotInUseError).Error() }) }},
	{"relay.SlotInUseError.Is", func(e *env) { e.call("SlotInUseError{}.Is(nil)", func() { _ = new(relay.SlotInUseError).Is(nil) }) }},
	{"relay.Slot", func(e *env) { e.call("Slot(\"\")", func() { _ = relay.Slot("") }) }},
	{"relay.New", func(e *env) {
		e.fails("relay.New(zero, nil)", func() error { _, err := relay.New(relay.Config{}, nil); return err })
	}},
	{"relay.Relay.Stats", func(e *env) { e.call("Relay{}.Stats", func() { new(relay.Relay).Stats() }) }},
	{"relay.Relay.Run", func(e *env) {
		e.fails("Relay{}.Run", func() error { return new(relay.Relay).Run(e.done) })
	}},
	{"relay.Relay.Close", func(e *env) { e.may("Relay{}.Close", func() error { return new(relay.Relay).Close() }) }},
	{"relay.Prerequisites", func(e *env) {
		e.fails("relay.Prerequisites(nil)", func() error { return relay.Prerequisites(e.ctx, nil) })
	}},
	{"relay.CreateSlot", func(e *env) {
		e.fails("relay.CreateSlot(nil, \"\")", func() error { return relay.CreateSlot(e.ctx, nil, "") })
	}},
	{"relay.DropSlot", func(e *env) {
		e.fails("relay.DropSlot(nil, \"\")", func() error { return relay.DropSlot(e.ctx, nil, "", false) })
	}},
	{"relay.StatusOf", func(e *env) {
		e.fails("relay.StatusOf(nil, \"\")", func() error { _, err := relay.StatusOf(e.ctx, nil, ""); return err })
	}},
	{"relay.Relay.Status", func(e *env) {
		r := must(relay.New(relay.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Relay.Status", func() error { _, err := r.Status(e.ctx); return err })
		e.fails("Relay{}.Status", func() error { _, err := new(relay.Relay).Status(e.ctx); return err })
	}},

	// ---- package retention
	{"retention.Config.Validate", func(e *env) {
		e.fails("retention.Config{}.Validate", func() error { return retention.Config{}.Validate() })
	}},
	{"retention.NewVacuum", func(e *env) {
		e.fails("NewVacuum(zero, nil)", func() error { _, err := retention.NewVacuum(retention.Config{}, nil); return err })
	}},
	{"retention.Vacuum.Stats", func(e *env) { e.call("Vacuum{}.Stats", func() { new(retention.Vacuum).Stats() }) }},
	{"retention.Vacuum.Run", func(e *env) {
		v := must(retention.NewVacuum(retention.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Vacuum.Run(ended ctx)", func() error { return v.Run(e.done) })
		e.fails("Vacuum{}.Run", func() error { return new(retention.Vacuum).Run(e.done) })
	}},
	{"retention.Vacuum.Close", func(e *env) { e.may("Vacuum{}.Close", func() error { return new(retention.Vacuum).Close() }) }},
	{"retention.Vacuum.VacuumOnce", func(e *env) {
		e.fails("Vacuum{}.VacuumOnce", func() error { _, err := new(retention.Vacuum).VacuumOnce(e.ctx); return err })
	}},
}

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

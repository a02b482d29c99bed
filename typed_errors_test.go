package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/partitioning"
)

// dbState is everything a bad input could have changed.
type dbState struct {
	topics, partitions, pending, log, schemas int
}

func snapshot(t *testing.T, e env) dbState {
	t.Helper()
	var s dbState
	s.topics, s.partitions, s.pending, s.log = e.Rows("topics"), e.Rows("partitions"), e.Rows("pending"), e.Rows("log")
	if err := e.Pool.QueryRow(outboxtest.Ctx(t), "SELECT count(*) FROM pg_namespace").Scan(&s.schemas); err != nil {
		t.Fatal(err)
	}
	return s
}

// errKeyFunc is a PartitionKeyFunc's own failure.
var errKeyFunc = errors.New("no customer id in the order")

func TestBadInputGivesTypedErrorAndChangesNothing(t *testing.T) {
	// Not parallel: the snapshot counts every schema of the database.
	e := newEnv(t)
	e.Register("orders", 4)
	base := outbox.PublisherConfig{Schema: e.Schema}
	msg := func() *message.Message {
		m := message.NewMessage("m", []byte("ok"))
		m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k")
		return m
	}
	// inTx publishes through a fresh transaction that is committed when the
	// publish "succeeded", so a half-written state would be visible.
	inTx := func(t *testing.T, cfg outbox.PublisherConfig, topic string, msgs ...*message.Message) error {
		tx, err := e.Pool.Begin(outboxtest.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		pub, err := outbox.NewTxPublisher(tx, cfg, nil)
		if err != nil {
			return err
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return err
		}
		return tx.Commit(outboxtest.Ctx(t))
	}
	cases := []struct {
		name string
		want error
		run  func(t *testing.T) error
	}{
		{"schema name with a quote", outbox.ErrInvalidName, func(t *testing.T) error {
			return outbox.Migrate(outboxtest.Ctx(t), e.Pool, `evil"; DROP SCHEMA public; --`)
		}},
		{"schema name upper case", outbox.ErrInvalidName, func(t *testing.T) error {
			_, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: "Outbox"}, nil)
			return err
		}},
		{"schema name too long", outbox.ErrInvalidName, func(t *testing.T) error {
			return outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, strings.Repeat("s", 49), "orders", 4)
		}},
		{"topic name with SQL", outbox.ErrInvalidName, func(t *testing.T) error {
			return inTx(t, base, "orders'; DELETE FROM log; --", msg())
		}},
		{"empty topic name", outbox.ErrInvalidName, func(t *testing.T) error { return inTx(t, base, "", msg()) }},
		{"topic name too long", outbox.ErrInvalidName, func(t *testing.T) error {
			return outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, strings.Repeat("t", 250), 1)
		}},
		{"oversize payload in a batch", outbox.ErrPayloadTooLarge, func(t *testing.T) error {
			big := message.NewMessage("big", make([]byte, 2048))
			cfg := base
			cfg.MaxPayloadBytes = 1024
			return inTx(t, cfg, "orders", msg(), big)
		}},
		{"partition count mismatch", outbox.ErrPartitionMismatch, func(t *testing.T) error {
			return outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "orders", 8)
		}},
		{"unregistered topic", outbox.ErrUnknownTopic, func(t *testing.T) error { return inTx(t, base, "never-registered", msg()) }},
		{"zero partitions", outbox.ErrInvalidPartitionCount, func(t *testing.T) error {
			return outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "zero", 0)
		}},
		{"1025 partitions", outbox.ErrInvalidPartitionCount, func(t *testing.T) error {
			return outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "many", 1025)
		}},
		{"publish after close", outbox.ErrPublisherClosed, func(t *testing.T) error {
			pub, err := outbox.NewPublisher(outbox.PublisherConfig{Schema: e.Schema, DB: e.Pool, OwnTransaction: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = pub.Close()
			return pub.Publish("orders", msg())
		}},
		{"nil tx", outbox.ErrNilTx, func(t *testing.T) error {
			_, err := outbox.NewTxPublisher(nil, base, nil)
			return err
		}},
		{"typed nil *sql.Tx", outbox.ErrNilTx, func(t *testing.T) error {
			_, err := outbox.NewTxPublisher((*sql.Tx)(nil), base, nil)
			return err
		}},
		{"nil pgx.Tx in the context", outbox.ErrNilTx, func(t *testing.T) error {
			pub, _ := outbox.NewPublisher(base, nil)
			m := msg()
			var tx pgx.Tx
			m.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx))
			return pub.Publish("orders", m)
		}},
		{"unsupported tx type", outbox.ErrUnsupportedTx, func(t *testing.T) error {
			_, err := outbox.NewTxPublisher("not a transaction", base, nil)
			return err
		}},
		{"no tx in the context", outbox.ErrNoTx, func(t *testing.T) error {
			pub, _ := outbox.NewPublisher(base, nil)
			return pub.Publish("orders", msg())
		}},
		{"messages in different transactions", outbox.ErrMixedTx, func(t *testing.T) error {
			pub, _ := outbox.NewPublisher(base, nil)
			tx1, _ := e.Pool.Begin(outboxtest.Ctx(t))
			defer tx1.Rollback(context.Background())
			tx2, _ := e.Pool.Begin(outboxtest.Ctx(t))
			defer tx2.Rollback(context.Background())
			a, b := msg(), msg()
			a.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx1))
			b.SetContext(outbox.WithTx(outboxtest.Ctx(t), tx2))
			return pub.Publish("orders", a, b)
		}},
		{"metadata with NUL", outbox.ErrInvalidMessage, func(t *testing.T) error {
			bad := msg()
			bad.Metadata.Set("k", "a\x00b")
			return inTx(t, base, "orders", msg(), bad)
		}},
		{"metadata not UTF-8", outbox.ErrInvalidMessage, func(t *testing.T) error {
			bad := msg()
			bad.Metadata.Set("k", "\xff\xfe")
			return inTx(t, base, "orders", bad)
		}},
		{"unknown topic without DB", outbox.ErrUnknownTopic, func(t *testing.T) error {
			return inTx(t, base, "never-registered", msg())
		}},
		{"negative payload limit", outbox.ErrInvalidConfig, func(t *testing.T) error {
			cfg := base
			cfg.MaxPayloadBytes = -1
			_, err := outbox.NewPublisher(cfg, nil)
			return err
		}},
		{"own transaction without DB", outbox.ErrInvalidConfig, func(t *testing.T) error {
			cfg := base
			cfg.OwnTransaction = true
			_, err := outbox.NewPublisher(cfg, nil)
			return err
		}},
		{"publish into an aborted transaction", outbox.ErrTxAborted, func(t *testing.T) error {
			tx, err := e.Pool.Begin(outboxtest.Ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			if _, err := tx.Exec(outboxtest.Ctx(t), "SELECT 1/0"); err == nil {
				t.Fatal("SELECT 1/0 did not fail")
			}
			pub, err := outbox.NewTxPublisher(tx, base, nil)
			if err != nil {
				t.Fatal(err)
			}
			return pub.Publish("orders", msg())
		}},
		{`outbox_unordered set by hand to "false"`, outbox.ErrInvalidMessage, func(t *testing.T) error {
			bad := msg()
			bad.Metadata.Set("outbox_unordered", "false")
			return inTx(t, base, "orders", msg(), bad)
		}},
		{"outbox_deliver_at set by hand to empty", outbox.ErrInvalidMessage, func(t *testing.T) error {
			bad := msg()
			bad.Metadata.Set("outbox_deliver_at", "")
			return inTx(t, base, "orders", bad)
		}},
		{"PartitionKeyFunc fails", errKeyFunc, func(t *testing.T) error {
			cfg := base
			cfg.PartitionKeyFunc = func(string, *message.Message) (string, error) { return "", errKeyFunc }
			err := inTx(t, cfg, "orders", msg())
			if !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Errorf("PartitionKeyFunc's failure %v does not match ErrInvalidMessage", err)
			}
			return err
		}},
		{"Migrate on a closed connection", outbox.ErrClosed, func(t *testing.T) error {
			conn, err := pgx.ConnectConfig(outboxtest.Ctx(t), e.Pool.Config().ConnConfig.Copy())
			if err != nil {
				t.Fatal(err)
			}
			_ = conn.Close(outboxtest.Ctx(t))
			return outbox.Migrate(outboxtest.Ctx(t), conn, "closed_conn_schema")
		}},
		{"a Partitioner out of range", outbox.ErrInvalidMessage, func(t *testing.T) error {
			cfg := base
			cfg.Partitioner = partitioning.PartitionerFunc(func(string, int) (int, error) { return 99, nil })
			return inTx(t, cfg, "orders", msg())
		}},
		{"a Partitioner that fails", errKeyFunc, func(t *testing.T) error {
			cfg := base
			cfg.Partitioner = partitioning.PartitionerFunc(func(string, int) (int, error) { return 0, errKeyFunc })
			return inTx(t, cfg, "orders", msg())
		}},
		{"Subscribe on an unregistered topic", outbox.ErrUnknownTopic, func(t *testing.T) error {
			sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "g"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			_, err = sub.Subscribe(outboxtest.Ctx(t), "never-registered")
			return err
		}},
		{"sequencer without pool", outbox.ErrInvalidConfig, func(t *testing.T) error {
			_, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: e.Schema}, nil)
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, e)
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panic: %v", r)
					}
				}()
				err = tc.run(t)
			}()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if after := snapshot(t, e); after != before {
				t.Fatalf("database changed: %+v -> %+v", before, after)
			}
		})
	}
}

package apicheck_test

import (
	"database/sql"
	"fmt"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

// coreEntries sweep package outbox.
var coreEntries = []entry{
	// ---- package outbox
	{"outbox.WithTx", func(e *env) {
		e.call("WithTx(ctx, nil)", func() { outbox.WithTx(e.ctx, nil) })
		e.call("WithTx(ctx, (*sql.Tx)(nil))", func() { outbox.WithTx(e.ctx, (*sql.Tx)(nil)) })
	}},
	{"outbox.TxFromContext", func(e *env) {
		e.call("TxFromContext[any](WithTx(ctx, nil))", func() { outbox.TxFromContext[any](outbox.WithTx(e.ctx, nil)) })
		e.call("TxFromContext[pgx.Tx](WithTx(ctx, nil))", func() { outbox.TxFromContext[pgx.Tx](outbox.WithTx(e.ctx, nil)) })
		e.call("TxFromContext[pgx.Tx](WithTx(ctx, pgx.Tx(nil)))", func() { outbox.TxFromContext[pgx.Tx](outbox.WithTx(e.ctx, pgx.Tx(nil))) })
		e.call("TxFromContext[*sql.Tx](WithTx(ctx, (*sql.Tx)(nil)))", func() { outbox.TxFromContext[*sql.Tx](outbox.WithTx(e.ctx, (*sql.Tx)(nil))) })
		e.call("TxFromContext[pgx.Tx](WithTx(ctx, (*wsql.PgxTx)(nil)))", func() { outbox.TxFromContext[pgx.Tx](outbox.WithTx(e.ctx, (*wsql.PgxTx)(nil))) })
		e.call("TxFromContext[*sql.Tx](WithTx(ctx, wsql.StdSQLTx{}))", func() { outbox.TxFromContext[*sql.Tx](outbox.WithTx(e.ctx, wsql.StdSQLTx{})) })
		e.call("TxFromContext[any](background)", func() { outbox.TxFromContext[any](e.ctx) })
	}},
	{"outbox.StableID", func(e *env) { e.call("StableID zero", func() { outbox.StableID("", 0, 0) }) }},
	{"outbox.DeliverAt", func(e *env) {
		e.fails("DeliverAt(nil, zero)", func() error { return outbox.DeliverAt(nil, time.Time{}) })
		e.fails("DeliverAt(msg, zero)", func() error { return outbox.DeliverAt(message.NewMessage("u", nil), time.Time{}) })
	}},
	{"outbox.DeliverAfter", func(e *env) {
		e.fails("DeliverAfter(nil, 0)", func() error { return outbox.DeliverAfter(nil, 0) })
		e.fails("DeliverAfter(msg, 0)", func() error { return outbox.DeliverAfter(message.NewMessage("u", nil), 0) })
	}},
	{"outbox.Unordered", func(e *env) { e.fails("Unordered(nil)", func() error { return outbox.Unordered(nil) }) }},
	{"outbox.DeliveryTime", func(e *env) {
		e.call("DeliveryTime(nil)", func() { _, _ = outbox.DeliveryTime(nil) })
		e.call("DeliveryTime(zero message)", func() { _, _ = outbox.DeliveryTime(&message.Message{}) })
	}},
	{"outbox.Reject", func(e *env) {
		e.fails("Reject(nil, nil)", func() error { return outbox.Reject(nil, nil) })
		e.call("Reject(msg, nil)", func() { _ = outbox.Reject(message.NewMessage("u", nil), nil) })
	}},
	{"outbox.RejectTo", func(e *env) {
		e.fails("RejectTo(nil, nil, nil)", func() error { return outbox.RejectTo(nil, nil, nil) })
		e.call("RejectTo(msg, nil, nil)", func() { _ = outbox.RejectTo(message.NewMessage("u", nil), nil, nil) })
		e.fails("RejectHandlerFunc(nil).HandleReject", func() error {
			return outboxtype.RejectHandlerFunc(nil).HandleReject(e.ctx, nil, outboxtype.RejectedMessage{})
		})
		e.call("RejectTo(msg, nil, RejectHandlerFunc(nil))", func() {
			_ = outbox.RejectTo(message.NewMessage("u", nil), nil, outboxtype.RejectHandlerFunc(nil))
		})
	}},
	{"outbox.IsDelivered", func(e *env) { e.call("IsDelivered(nil)", func() { outbox.IsDelivered(nil) }) }},
	{"outbox.QuietRejects", func(e *env) {
		e.fails("QuietRejects(nil)(msg)", func() error {
			_, err := outbox.QuietRejects(nil)(message.NewMessage("u", nil))
			return err
		})
		e.fails("QuietRejects(h)(nil), h rejecting it", func() error {
			_, err := outbox.QuietRejects(func(m *message.Message) ([]*message.Message, error) { return nil, outbox.Reject(m, nil) })(nil)
			return err
		})
	}},
	{"outbox.Tombstone", func(e *env) {
		e.fails("Tombstone(nil)", func() error { return outbox.Tombstone(nil) })
		e.fails("Tombstone(msg with a payload)", func() error { return outbox.Tombstone(message.NewMessage("u", []byte("x"))) })
		e.may("Tombstone(&Message{})", func() error { return outbox.Tombstone(&message.Message{}) })
	}},
	{"outbox.IsTombstone", func(e *env) {
		e.call("IsTombstone(nil)", func() { outbox.IsTombstone(nil) })
		e.call("IsTombstone(&Message{})", func() { outbox.IsTombstone(&message.Message{}) })
	}},
	{"outbox.DedupKey", func(e *env) {
		e.fails("DedupKey(nil, k)", func() error { return outbox.DedupKey(nil, "k") })
		e.fails("DedupKey(msg, \"\")", func() error { return outbox.DedupKey(message.NewMessage("u", nil), "") })
		e.fails("DedupKey(msg, NUL)", func() error { return outbox.DedupKey(message.NewMessage("u", nil), "a\x00") })
		e.fails("DedupKey(msg, invalid UTF-8)", func() error { return outbox.DedupKey(message.NewMessage("u", nil), "\xff") })
		e.may("DedupKey(Message{}, k)", func() error { return outbox.DedupKey(&message.Message{}, "k") })
	}},
	{"outbox.Deduplicated", func(e *env) {
		e.call("Deduplicated(nil)", func() { outbox.Deduplicated(nil) })
		e.call("Deduplicated(Message{})", func() { outbox.Deduplicated(&message.Message{}) })
	}},
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
			m.Metadata.Set(outbox.PublishPartitionKeyMetadata, "k")
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
	{"outbox.Strategy.String", func(e *env) { e.call("Strategy(0).String", func() { _ = outbox.Strategy(0).String() }) }},
	{"outbox.SubscriberConfig.Validate", func(e *env) {
		e.fails("SubscriberConfig{}.Validate", func() error { return outbox.SubscriberConfig{}.Validate() })
		e.fails("SubscriberConfig{RejectHandler: RejectHandlerFunc(nil)}.Validate", func() error {
			cfg := subCfg(e)
			cfg.RejectHandler = outboxtype.RejectHandlerFunc(nil)
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
	{"outbox.ForwardOnly", func(e *env) {
		e.call("ForwardOnly()", func() { _ = outbox.ForwardOnly() })
		e.fails("RegisterTopic(nil pool, ForwardOnly(), TopicOption{})", func() error {
			return outbox.RegisterTopic(e.ctx, (*pgxpool.Pool)(nil), "", "orders", 1, outbox.ForwardOnly(), outbox.TopicOption{})
		})
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
}

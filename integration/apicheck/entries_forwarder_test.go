package apicheck_test

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

// forwarderEntries sweep forwarder and its targets, forwarder/jetstream and forwarder/kafka.
var forwarderEntries = []entry{
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
	{"forwarder.CloudEvents.Validate", func(e *env) {
		e.may("forwarder.CloudEvents{}.Validate", func() error { return forwarder.CloudEvents{}.Validate() })
		e.fails("forwarder.CloudEvents{Mode: binary}.Validate", func() error {
			return forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary}.Validate()
		})
		e.may("forwarder.CloudEvents{Mode: binary, Source, Type: nil}.Validate", func() error {
			return forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", Type: nil}.Validate()
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
	{"kafka.Target.CheckTopic", func(e *env) {
		e.fails("kafka.Target{}.CheckTopic", func() error { return new(kafka.Target).CheckTopic(e.ctx, "orders", 1) })
		e.fails("(*kafka.Target)(nil).CheckTopic", func() error { return (*kafka.Target)(nil).CheckTopic(e.ctx, "orders", 1) })
		t := must(kafka.NewTarget(kafka.Config{Brokers: startKafka(e), ClientOptions: []kgo.Opt{kgo.DialTimeout(time.Second)}}, nil))(e)
		var noCtx context.Context
		e.fails("kafka.Target.CheckTopic(nil ctx)", func() error { return t.CheckTopic(noCtx, "orders", 1) })
		e.may("kafka.Target.CheckTopic(\"\", 0)", func() error { return t.CheckTopic(e.ctx, "", 0) })
		e.may("kafka.Target.CheckTopic(orders, -1)", func() error { return t.CheckTopic(e.ctx, "orders", -1) })
		e.may("kafka.Target.Close", t.Close)
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
}

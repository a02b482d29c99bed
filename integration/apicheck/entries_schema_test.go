package apicheck_test

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// avsc is the sweep's Avro schema.
const avsc = `{"type": "record", "name": "Order", "namespace": "apicheck", "fields": [{"name": "id", "type": "string"}]}`

// newCodec is a Codec with a schema for topic "orders", on an in-process
// registry.
func newCodec(e *env) *schema.Codec {
	s := schematest.NewStandIn()
	url, err := s.Start()
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		e.t.Fatal(err)
	}
	return must(schema.New(e.ctx, schema.Config{Client: cl, Schemas: []schema.TopicSchema{{Topic: "orders", Format: schema.Avro, Text: avsc}}}, nil))(e)
}

// schemaEntries sweep schema.
var schemaEntries = []entry{
	{"schema.New", func(e *env) {
		e.fails("schema.New(zero)", func() error { _, err := schema.New(e.ctx, schema.Config{}, nil); return err })
		cl, err := sr.NewClient(sr.URLs("http://127.0.0.1:1"))
		if err != nil {
			e.t.Fatal(err)
		}
		e.fails("schema.New(unreachable registry)", func() error {
			_, err := schema.New(e.ctx, schema.Config{Client: cl, Schemas: []schema.TopicSchema{{Topic: "orders", Format: schema.Avro, Text: avsc}}}, nil)
			return err
		})
	}},
	{"schema.Config.Validate", func(e *env) { e.fails("Config{}.Validate", func() error { return schema.Config{}.Validate() }) }},
	{"schema.Format.String", func(e *env) { e.call("Format(0).String", func() { _ = schema.Format(0).String() }) }},
	{"schema.Format.ContentType", func(e *env) { e.call("Format(0).ContentType", func() { _ = schema.Format(0).ContentType() }) }},
	{"schema.SubjectStrategy.String", func(e *env) { e.call("SubjectStrategy(9).String", func() { _ = schema.SubjectStrategy(9).String() }) }},
	{"schema.SubjectStrategy.Subject", func(e *env) {
		e.call("SubjectStrategy(9).Subject", func() { _ = schema.SubjectStrategy(9).Subject("", "") })
	}},
	{"schema.Codec.Publisher", func(e *env) {
		e.fails("Codec.Publisher(nil)", func() error { _, err := newCodec(e).Publisher(nil); return err })
		e.fails("Codec{}.Publisher", func() error { _, err := new(schema.Codec).Publisher(nil); return err })
	}},
	{"schema.Codec.NewMessage", func(e *env) {
		c := newCodec(e)
		e.fails("Codec.NewMessage(orders, nil)", func() error { _, err := c.NewMessage("orders", nil); return err })
		e.fails("Codec.NewMessage(\"\", nil)", func() error { _, err := c.NewMessage("", nil); return err })
		e.fails("Codec{}.NewMessage", func() error { _, err := new(schema.Codec).NewMessage("", nil); return err })
	}},
	{"schema.Codec.Decode", func(e *env) {
		c := newCodec(e)
		e.fails("Codec.Decode(nil, nil)", func() error { return c.Decode(nil, nil) })
		e.fails("Codec.Decode(msg, nil)", func() error { return c.Decode(message.NewMessage("u", nil), nil) })
		e.fails("Codec.Decode(empty msg, &v)", func() error { var v any; return c.Decode(message.NewMessage("u", nil), &v) })
		e.fails("Codec{}.Decode", func() error { return new(schema.Codec).Decode(nil, nil) })
	}},
	{"schema.Codec.JSON", func(e *env) {
		c := newCodec(e)
		e.may("Codec.JSON(nil payload)", func() error { _, _, _, err := c.JSON(e.ctx, nil); return err })
		e.fails("Codec{}.JSON", func() error { _, _, _, err := new(schema.Codec).JSON(e.ctx, nil); return err })
	}},
	{"schema.Handler", func(e *env) {
		e.fails("Handler(nil, nil)(msg)", func() error { return schema.Handler[any](nil, nil)(message.NewMessage("u", nil)) })
		e.fails("Handler(codec, nil)(msg)", func() error { return schema.Handler[any](newCodec(e), nil)(message.NewMessage("u", nil)) })
		e.fails("Handler(codec, fn)(nil)", func() error {
			return schema.Handler(newCodec(e), func(*message.Message, any) error { return nil })(nil)
		})
	}},
	{"schema.Codec.Topics", func(e *env) { e.call("Codec{}.Topics", func() { _ = new(schema.Codec).Topics() }) }},
	{"schema.Publisher.Publish", func(e *env) {
		pub := must(newCodec(e).Publisher(sendPublisher{}))(e)
		for _, msgs := range nilMsgs {
			e.may("Publisher.Publish(orders, nil…)", func() error { return pub.Publish("orders", msgs...) })
		}
		e.fails("Publisher{}.Publish", func() error { return new(schema.Publisher).Publish("orders") })
	}},
	{"schema.Publisher.Close", func(e *env) {
		e.fails("Publisher{}.Close", func() error { return new(schema.Publisher).Close() })
	}},
	{"schema.SchemaError.Error", func(e *env) { e.call("SchemaError{}.Error", func() { _ = new(schema.SchemaError).Error() }) }},
	{"schema.SchemaError.Is", func(e *env) { e.call("SchemaError{}.Is(nil)", func() { _ = new(schema.SchemaError).Is(nil) }) }},
	{"schema.SchemaError.Unwrap", func(e *env) { e.call("SchemaError{}.Unwrap", func() { _ = new(schema.SchemaError).Unwrap() }) }},
	{"schema.RegistryError.Error", func(e *env) { e.call("RegistryError{}.Error", func() { _ = new(schema.RegistryError).Error() }) }},
	{"schema.RegistryError.Is", func(e *env) { e.call("RegistryError{}.Is(nil)", func() { _ = new(schema.RegistryError).Is(nil) }) }},
	{"schema.RegistryError.Unwrap", func(e *env) { e.call("RegistryError{}.Unwrap", func() { _ = new(schema.RegistryError).Unwrap() }) }},
}

// sendPublisher is a message.Publisher that refuses nil messages, as the
// outbox Publisher does.
type sendPublisher struct{}

func (sendPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m == nil {
			return schema.ErrMismatch
		}
	}
	return nil
}

func (sendPublisher) Close() error { return nil }

package schema_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// printer is a message.Publisher that prints what it is given: in a
// service, the outbox Publisher.
type printer struct{}

func (printer) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		fmt.Printf("%s: %d bytes, schema id %s, magic byte %d\n", topic, len(m.Payload), m.Metadata.Get(schema.MetadataSchemaID), m.Payload[0])
	}
	return nil
}

func (printer) Close() error { return nil }

// Validate every event of topic "orders" against its Avro schema before it
// is published: a Go value is encoded, a payload that does not match is
// refused with the topic, subject and version.
func ExampleCodec_Publisher() {
	registry := schematest.NewStandIn() // in a service: the registry's URL
	url, err := registry.Start()
	if err != nil {
		panic(err)
	}
	defer registry.Close()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		panic(err)
	}
	codec, err := schema.New(context.Background(), schema.Config{
		Client: cl,
		Schemas: []schema.TopicSchema{{Topic: "orders", Format: schema.Avro, Text: `{"type": "record", "name": "Order", "namespace": "shop",
			"fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]}`}},
	}, nil)
	if err != nil {
		panic(err)
	}
	pub, err := codec.Publisher(printer{}) // in a service: the outbox Publisher
	if err != nil {
		panic(err)
	}
	type Order struct {
		ID  string `avro:"id"`
		Qty int    `avro:"qty"`
	}
	msg, err := codec.NewMessage("orders", Order{ID: "o1", Qty: 2})
	if err != nil {
		panic(err)
	}
	if err := pub.Publish("orders", msg); err != nil {
		panic(err)
	}
	err = pub.Publish("orders", message.NewMessage("m2", []byte(`{"id": "o2"}`)))
	var se *schema.SchemaError
	fmt.Println(errors.As(err, &se), errors.Is(err, schema.ErrMismatch), se.Subject, se.Version)
	// Output:
	// orders: 9 bytes, schema id 1, magic byte 0
	// true true orders-value 1
}

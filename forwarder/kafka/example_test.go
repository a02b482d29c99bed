package kafka_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

// A tombstone becomes a record with a null value, which a compacted topic
// takes as the deletion of the record's key (the target sets the key: the
// partition key). Another message with an empty payload keeps a non-null,
// empty value.
func ExampleDefaultMarshaler_tombstone() {
	deleted := message.NewMessage("user-42-theme-deleted", nil)
	deleted.Metadata.Set(outbox.PublishPartitionKeyMetadata, "user-42/theme")
	if err := outbox.Tombstone(deleted); err != nil {
		panic(err)
	}
	r, err := kafka.DefaultMarshaler{}.Marshal("settings", deleted)
	if err != nil {
		panic(err)
	}
	fmt.Println("tombstone value is null:", r.Value == nil)

	r, err = kafka.DefaultMarshaler{}.Marshal("settings", message.NewMessage("empty", nil))
	if err != nil {
		panic(err)
	}
	fmt.Println("empty message value is null:", r.Value == nil)
	// Output:
	// tombstone value is null: true
	// empty message value is null: false
}

// Send the messages as CloudEvents in binary mode: the record value is the
// payload, the attributes are headers ce_id (the stable outbox id),
// ce_source, ce_type (metadata "ce_type" of each message), ce_time,
// ce_subject (the record key) and content-type.
func ExampleConfig_cloudEvents() {
	cfg := kafka.Config{
		Brokers: []string{"kafka:9092"},
		CloudEvents: forwarder.CloudEvents{
			Mode:            forwarder.CloudEventsBinary,
			Source:          "/shop/orders",
			DataContentType: "application/json",
		},
	}
	fmt.Println(cfg.Validate())

	cfg.CloudEvents.Source = "" // required
	fmt.Println(cfg.Validate())
	// Output:
	// <nil>
	// outbox: invalid configuration: CloudEvents.Source: required with a Mode: a URI-reference naming the producer, e.g. /shop/orders
}

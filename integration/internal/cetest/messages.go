package cetest

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
)

// Batch returns n outbox messages with keys "key-<i>", JSON payloads and
// the type in metadata ce_type; message 1 has its time in metadata
// ce_time, message 2 a payload that is no JSON, message 3 (of more than
// 3) a payload in a schema registry's wire format with metadata
// ce_dataschema (DataSchema) and ce_datacontenttype "application/avro",
// as schema.Publisher leaves them. The Kafka and JetStream tests send it
// alike.
func Batch(n int) []*message.Message {
	batch := fwdtest.OutboxBatch(n, func(i int) string { return fmt.Sprintf("key-%d", i) })
	for i, m := range batch {
		m.Payload = []byte(fmt.Sprintf(`{"n":%d}`, i))
		m.Metadata.Set("ce_type", "com.example.order.placed")
	}
	batch[1].Metadata.Set("ce_time", "2024-05-06T07:08:09.5+02:00")
	batch[2].Payload = []byte("not json")
	if n > 3 {
		batch[3].Payload = []byte{0, 0, 0, 0, 7, 2, 'x'}
		batch[3].Metadata.Set(forwarder.DataSchemaMetadata, DataSchema)
		batch[3].Metadata.Set(forwarder.DataContentTypeMetadata, "application/avro")
	}
	return batch
}

// DataSchema is the dataschema of message 3 of Batch.
const DataSchema = "https://registry.example/schemas/ids/7"

// ContentType returns the datacontenttype of m's event from a target whose
// CloudEvents.DataContentType is def: m's metadata ce_datacontenttype, else
// def.
func ContentType(m *message.Message, def string) string {
	if v := m.Metadata.Get(forwarder.DataContentTypeMetadata); v != "" {
		return v
	}
	return def
}

// Setting returns a message of key with value (a tombstone when
// tombstone), as an application publishes it into the outbox.
func Setting(t testing.TB, key, value string, tombstone bool) *message.Message {
	t.Helper()
	m := message.NewMessage(watermill.NewUUID(), []byte(value))
	m.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
	m.Metadata.Set("ce_type", "com.example.setting.changed")
	if tombstone {
		m.Payload = nil
		m.Metadata.Set("ce_type", "com.example.setting.deleted")
		if err := outbox.Tombstone(m); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

package cetest

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
)

// Batch returns n outbox messages with keys "key-<i>", JSON payloads and
// the type in metadata ce_type; message 1 has its time in metadata
// ce_time, message 2 a payload that is no JSON. The Kafka and JetStream
// tests send it alike.
func Batch(n int) []*message.Message {
	batch := fwdtest.OutboxBatch(n, func(i int) string { return fmt.Sprintf("key-%d", i) })
	for i, m := range batch {
		m.Payload = []byte(fmt.Sprintf(`{"n":%d}`, i))
		m.Metadata.Set("ce_type", "com.example.order.placed")
	}
	batch[1].Metadata.Set("ce_time", "2024-05-06T07:08:09.5+02:00")
	batch[2].Payload = []byte("not json")
	return batch
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

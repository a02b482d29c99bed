package outbox_test

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// Delete the setting "theme" of user 42: a tombstone is a message with
// the key and no payload. Forwarded to a compacted Kafka topic, it becomes
// a record with a null value, and compaction removes the key.
func ExampleTombstone() {
	msg := message.NewMessage("settings-42-theme-deleted", nil)
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, "user-42/theme")
	if err := outbox.Tombstone(msg); err != nil {
		panic(err)
	}
	fmt.Println(outbox.IsTombstone(msg), msg.Metadata.Get(outbox.MetadataTombstone))
	// pub.Publish("settings", msg) in the transaction that deletes the row.

	// A tombstone carries no value.
	err := outbox.Tombstone(message.NewMessage("not-empty", []byte(`{"theme":"dark"}`)))
	fmt.Println(errors.Is(err, outbox.ErrInvalidMessage))
	// Output:
	// true true
	// true
}

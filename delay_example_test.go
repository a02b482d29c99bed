package outbox_test

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
)

// A reminder that must not go out before tomorrow: published now, in the
// transaction that records it, delivered then. The later messages of the
// customer's key wait behind it.
func ExampleDeliverAfter() {
	msg := message.NewMessage("reminder-42", []byte(`{"invoice":42}`))
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, "customer-7")
	if err := outbox.DeliverAfter(msg, 24*time.Hour); err != nil {
		panic(err)
	}
	// ... publisher.Publish("reminders", msg) in the transaction ...
	at, _ := outbox.DeliveryTime(msg)
	fmt.Println("due in", time.Until(at).Round(time.Hour))
	// A past time is refused: publish without a delay to deliver now.
	fmt.Println(outbox.DeliverAt(msg, time.Now().Add(-time.Minute)) != nil)
	// Output:
	// due in 24h0m0s
	// true
}

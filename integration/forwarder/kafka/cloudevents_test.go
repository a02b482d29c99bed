package kafka_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/cetest"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

var ceModes = []struct {
	name     string
	mode     forwarder.CloudEventsMode
	encoding binding.Encoding
}{
	{"binary", forwarder.CloudEventsBinary, binding.EncodingBinary},
	{"structured", forwarder.CloudEventsStructured, binding.EncodingStructured},
}

// ceTarget returns a target on c sending CloudEvents in mode.
func ceTarget(t *testing.T, c *kafkatest.Cluster, atLeastOnce bool, mode forwarder.CloudEventsMode) *kafka.Target {
	t.Helper()
	return newTargetWith(t, kafka.Config{Brokers: c.Brokers, AtLeastOnce: atLeastOnce, CloudEvents: forwarder.CloudEvents{
		Mode: mode, Source: "https://shop.example/orders", DataContentType: "application/json",
	}})
}

// checkEvents reads each record of batch with the CloudEvents SDK and
// checks its attributes and data; sent bounds the time of events without
// ce_time.
func checkEvents(t *testing.T, rs []*kgo.Record, batch []*message.Message, encoding binding.Encoding, sent time.Time) {
	t.Helper()
	if len(rs) != len(batch) {
		t.Fatalf("%d records, want %d", len(rs), len(batch))
	}
	for _, r := range rs {
		i := atoi(kafkatest.Header(r, "i"))
		m := batch[i]
		msg := cetest.FromKafka(r)
		if msg.ReadEncoding() != encoding {
			t.Fatalf("record %d: %v encoding, want %v", i, msg.ReadEncoding(), encoding)
		}
		ev := cetest.Event(t, msg)
		id := m.Metadata.Get(outbox.MetadataID)
		if ev.SpecVersion() != "1.0" || ev.ID() != id || ev.Source() != "https://shop.example/orders" || ev.Type() != "com.example.order.placed" ||
			ev.Subject() != string(r.Key) || ev.Subject() != fmt.Sprintf("key-%d", i) || ev.DataContentType() != cetest.ContentType(m, "application/json") ||
			ev.DataSchema() != m.Metadata.Get(forwarder.DataSchemaMetadata) {
			t.Fatalf("record %d: event %s", i, ev)
		}
		if string(ev.Data()) != string(m.Payload) {
			t.Fatalf("record %d: data %q, want %q", i, ev.Data(), m.Payload)
		}
		if i == 1 {
			if want := time.Date(2024, 5, 6, 5, 8, 9, 5e8, time.UTC); !ev.Time().Equal(want) {
				t.Fatalf("record 1: time %v, want %v (metadata ce_time)", ev.Time(), want)
			}
		} else if ev.Time().Before(sent.Add(-time.Second)) || ev.Time().After(time.Now().Add(time.Second)) {
			t.Fatalf("record %d: time %v, want the send's (%v)", i, ev.Time(), sent)
		}
		// The metadata headers stay, the outbox ones the tail read needs too.
		if kafkatest.Header(r, outbox.MetadataID) != id || kafkatest.Header(r, kafka.UUIDHeaderKey) != m.UUID {
			t.Fatalf("record %d: headers %v", i, r.Headers)
		}
		if ct := kafkatest.Header(r, "content-type"); encoding == binding.EncodingStructured && ct != "application/cloudevents+json" ||
			encoding == binding.EncodingBinary && (ct != cetest.ContentType(m, "application/json") || kafkatest.Header(r, "ce_id") != id) {
			t.Fatalf("record %d: content-type %q, headers %v", i, ct, r.Headers)
		}
	}
}

// The records of a target with CloudEvents are events the CloudEvents SDK
// reads (the Kafka binding's rules: binary by its ce_ headers, structured
// by content-type), in both delivery modes: id the stable outbox id,
// subject the record key, time from metadata ce_time or the send's,
// dataschema and datacontenttype from metadata ce_dataschema and
// ce_datacontenttype when set, data the payload (in structured mode JSON
// as it is, other payloads, the wire format of a schema's record among
// them, in data_base64).
func TestCloudEventsAreReadByTheSDK(t *testing.T) {
	for _, ce := range ceModes {
		for _, mode := range deliveryModes {
			t.Run(ce.name+"/"+mode.name, func(t *testing.T) {
				c := kafkatest.New(t)
				topic := c.Topic(t, "orders", 1, nil)
				target := ceTarget(t, c, mode.atLeastOnce, ce.mode)
				batch := cetest.Batch(5)
				sent := time.Now()
				if done, err := target.Send(outboxtest.Ctx(t), topic, batch); done != len(batch) || err != nil {
					t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
				}
				checkEvents(t, c.ReadCommitted(t, topic), batch, ce.encoding, sent)
			})
		}
	}
}

// Exactly once holds with CloudEvents: the next owner of a partition reads
// the tail back, finding the previous owner's records by their outbox_*
// headers, which stay in both modes, and skips what it committed (without
// the tail read the six records would arrive twice: see
// TestCommittedBatchIsNotSentAgainByTheNextOwner).
func TestCloudEventsKeepExactlyOnceThroughATakeover(t *testing.T) {
	for _, ce := range ceModes {
		t.Run(ce.name, func(t *testing.T) {
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 1, nil)
			a := ceTarget(t, c, false, ce.mode)
			b := ceTarget(t, c, false, ce.mode)
			batch := cetest.Batch(10)
			sent := time.Now()
			if done, err := a.Send(outboxtest.Ctx(t), topic, batch[:6]); done != 6 || err != nil {
				t.Fatalf("A: done %d, %v", done, err)
			}
			// A dies here; B gets the whole batch from the cursor.
			if done, err := b.Send(outboxtest.Ctx(t), topic, batch); done != len(batch) || err != nil {
				t.Fatalf("B: done %d of %d, %v", done, len(batch), err)
			}
			rs := c.ReadCommitted(t, topic)
			fwdtest.AssertPositions(t, "committed records", positions(records(rs)), fwdtest.UpTo(0, 10))
			checkEvents(t, rs, batch, ce.encoding, sent)
		})
	}
}

// A message the target cannot make an event of is rejected (dead letter)
// with a *outboxtype.MessageError, the messages before it delivered: no type,
// a ce_time that is no RFC 3339 time, a ce_dataschema that is no absolute
// URI, a ce_datacontenttype that is no media type, metadata a receiver
// would read as an attribute (ce_…, content-type).
func TestCloudEventsRejectMessagesWithoutAnEvent(t *testing.T) {
	for _, bad := range []struct {
		name string
		edit func(*message.Message)
	}{
		{"no type", func(m *message.Message) { delete(m.Metadata, "ce_type") }},
		{"a bad time", func(m *message.Message) { m.Metadata.Set("ce_time", "yesterday") }},
		{"an attribute in metadata", func(m *message.Message) { m.Metadata.Set("ce_id", "mine") }},
		{"an extension in metadata", func(m *message.Message) { m.Metadata.Set("CE_Traceparent", "x") }},
		{"a content type in metadata", func(m *message.Message) { m.Metadata.Set("Content-Type", "text/plain") }},
		{"a dataschema that is no absolute URI", func(m *message.Message) { m.Metadata.Set(forwarder.DataSchemaMetadata, "schemas/ids/7") }},
		{"a datacontenttype that is no media type", func(m *message.Message) { m.Metadata.Set(forwarder.DataContentTypeMetadata, "avro") }},
	} {
		t.Run(bad.name, func(t *testing.T) {
			c := kafkatest.New(t)
			topic := c.Topic(t, "orders", 1, nil)
			target := ceTarget(t, c, false, forwarder.CloudEventsBinary)
			batch := cetest.Batch(3)
			bad.edit(batch[1])
			done, err := target.Send(outboxtest.Ctx(t), topic, batch)
			var me *outboxtype.MessageError
			if done != 1 || !errors.Is(err, outbox.ErrPoison) || !errors.As(err, &me) || me.UUID != batch[1].UUID {
				t.Fatalf("Send: done %d, %v; want 1 and message 1 rejected with a *MessageError", done, err)
			}
			t.Logf("%v", err)
			fwdtest.AssertPositions(t, "records", positions(kafkaLog(t, c, topic)), []int{0})
		})
	}
}

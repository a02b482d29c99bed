package jetstream_test

import (
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cloudevents/sdk-go/v2/binding"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/integration/internal/cetest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// The messages of a target with CloudEvents are events the CloudEvents SDK
// reads with the NATS binding's rules (binary by its ce-specversion
// header, structured otherwise): id the stable outbox id, subject the
// partition key, time from metadata ce_time or the send's, data the
// payload. The watermill metadata headers and Nats-Msg-Id stay.
func TestJetStreamCloudEventsAreReadByTheSDK(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	for _, ce := range []struct {
		name     string
		mode     forwarder.CloudEventsMode
		encoding binding.Encoding
	}{
		{"binary", forwarder.CloudEventsBinary, binding.EncodingBinary},
		{"structured", forwarder.CloudEventsStructured, binding.EncodingStructured},
	} {
		t.Run(ce.name, func(t *testing.T) {
			target := newTargetWith(t, jetstream.Config{URL: s.ClientURL(), CloudEvents: forwarder.CloudEvents{
				Mode: ce.mode, Source: "https://shop.example/orders", DataContentType: "application/json",
			}})
			name := "orders_" + ce.name
			stream, err := target.JetStream().CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{Name: name, Subjects: []string{name}})
			if err != nil {
				t.Fatal(err)
			}
			batch := cetest.Batch(4)
			sent := time.Now()
			if done, err := target.Send(outboxtest.Ctx(t), name, batch); done != len(batch) || err != nil {
				t.Fatalf("Send: done %d of %d, %v", done, len(batch), err)
			}
			for i, m := range batch {
				raw, err := stream.GetMsg(outboxtest.Ctx(t), uint64(i+1))
				if err != nil {
					t.Fatal(err)
				}
				msg := cetest.FromNATS(raw.Header, raw.Data)
				if msg.ReadEncoding() != ce.encoding {
					t.Fatalf("message %d: %v encoding, want %v", i, msg.ReadEncoding(), ce.encoding)
				}
				ev := cetest.Event(t, msg)
				id := m.Metadata.Get(outbox.MetadataID)
				if ev.ID() != id || ev.Source() != "https://shop.example/orders" || ev.Type() != "com.example.order.placed" ||
					ev.Subject() != fmt.Sprintf("key-%d", i) || ev.DataContentType() != cetest.ContentType(m, "application/json") ||
					ev.DataSchema() != m.Metadata.Get(forwarder.DataSchemaMetadata) || string(ev.Data()) != string(m.Payload) {
					t.Fatalf("message %d: event %s, data %q", i, ev, ev.Data())
				}
				if i == 1 {
					if want := time.Date(2024, 5, 6, 5, 8, 9, 5e8, time.UTC); !ev.Time().Equal(want) {
						t.Fatalf("message 1: time %v, want %v", ev.Time(), want)
					}
				} else if ev.Time().Before(sent.Add(-time.Second)) || ev.Time().After(time.Now().Add(time.Second)) {
					t.Fatalf("message %d: time %v, want the send's", i, ev.Time())
				}
				if raw.Header.Get(outbox.MetadataID) != id || raw.Header.Get("Nats-Msg-Id") != id || raw.Header.Get("_watermill_message_uuid") != m.UUID {
					t.Fatalf("message %d: headers %v", i, raw.Header)
				}
				if ct := raw.Header.Get("Content-Type"); (ce.mode == forwarder.CloudEventsStructured) != (ct == "application/cloudevents+json") {
					t.Fatalf("message %d: Content-Type %q", i, ct)
				}
			}
		})
	}
}

// Header values are percent-encoded as the NATS binding requires (space,
// '"', '%' and non-ASCII as %XX of their UTF-8 bytes); decoded, they are
// the attribute. (The Go SDK's reader takes them as they are: ASCII
// values without those characters read the same either way.)
func TestJetStreamCloudEventsPercentEncodeHeaderValues(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	target := newTargetWith(t, jetstream.Config{URL: s.ClientURL(), CloudEvents: forwarder.CloudEvents{
		Mode: forwarder.CloudEventsBinary, Source: "/shop", Type: func(*message.Message) string { return `order "placed" 100%` },
	}})
	createStream(t, s.ClientURL(), "orders", 0)
	batch := fwdtest.OutboxBatch(1, func(int) string { return "clé 1" })
	if done, err := target.Send(outboxtest.Ctx(t), "orders", batch); done != 1 || err != nil {
		t.Fatalf("Send: done %d, %v", done, err)
	}
	stream, err := target.JetStream().Stream(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetMsg(outboxtest.Ctx(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	for header, want := range map[string]string{"ce-subject": "cl%C3%A9%201", "ce-type": "order%20%22placed%22%20100%25"} {
		got := raw.Header.Get(header)
		decoded, err := url.PathUnescape(got)
		if got != want || err != nil {
			t.Fatalf("%s: %q, want %q", header, got, want)
		}
		t.Logf("%s: %q decodes to %q", header, got, decoded)
	}
}

// A message the target cannot make an event of is rejected with a
// *outboxtype.MessageError, the messages before it delivered: no type, a
// ce_time that is no RFC 3339 time, metadata a receiver would read as an
// attribute (ce-…, content-type).
func TestJetStreamCloudEventsRejectMessagesWithoutAnEvent(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	for _, bad := range []struct {
		name string
		edit func(*message.Message)
	}{
		{"no type", func(m *message.Message) { delete(m.Metadata, "ce_type") }},
		{"a bad time", func(m *message.Message) { m.Metadata.Set("ce_time", "yesterday") }},
		{"an attribute in metadata", func(m *message.Message) { m.Metadata.Set("ce-id", "mine") }},
		{"a content type in metadata", func(m *message.Message) { m.Metadata.Set("content-type", "text/plain") }},
		{"a dataschema that is no absolute URI", func(m *message.Message) { m.Metadata.Set(forwarder.DataSchemaMetadata, "schemas/ids/7") }},
		{"a datacontenttype that is no media type", func(m *message.Message) { m.Metadata.Set(forwarder.DataContentTypeMetadata, "avro") }},
	} {
		t.Run(bad.name, func(t *testing.T) {
			target := newTargetWith(t, jetstream.Config{URL: s.ClientURL(), CloudEvents: forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop"}})
			name := fmt.Sprintf("s%d", time.Now().UnixNano())
			if _, err := target.JetStream().CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{Name: name, Subjects: []string{name}}); err != nil {
				t.Fatal(err)
			}
			batch := cetest.Batch(3)
			bad.edit(batch[1])
			done, err := target.Send(outboxtest.Ctx(t), name, batch)
			var me *outboxtype.MessageError
			if done != 1 || !errors.Is(err, outbox.ErrPoison) || !errors.As(err, &me) || me.UUID != batch[1].UUID {
				t.Fatalf("Send: done %d, %v; want 1 and message 1 rejected with a *MessageError", done, err)
			}
			t.Logf("%v", err)
		})
	}
}

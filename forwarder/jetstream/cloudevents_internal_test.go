package jetstream

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/millrace/watermill-outbox/forwarder"
)

// Binary mode: the dataschema is header ce-dataschema and the message's
// content type ce-datacontenttype (over Config's DataContentType).
func TestCloudEventBinaryCarriesTheDataSchema(t *testing.T) {
	cfg := forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop", DataContentType: "application/json"}
	m := message.NewMessage("u1", append([]byte{0, 0, 0, 0, 7}, 2, 'x'))
	m.Metadata.Set("ce_type", "order.placed")
	m.Metadata.Set(forwarder.DataSchemaMetadata, "http://registry:8081/schemas/ids/7")
	m.Metadata.Set(forwarder.DataContentTypeMetadata, "application/avro")
	nm := &nats.Msg{Subject: "orders", Data: m.Payload, Header: nats.Header{}}
	if err := cloudEvent(cfg, nm, m, "k", false); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"ce-dataschema": "http://registry:8081/schemas/ids/7", "ce-datacontenttype": "application/avro"} {
		if got := nm.Header.Values(key); len(got) != 1 || got[0] != want {
			t.Errorf("header %s: %q, want [%q]; headers %v", key, got, want, nm.Header)
		}
	}
}

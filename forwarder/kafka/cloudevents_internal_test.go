package kafka

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/forwarder"
)

// schemaMessage is a message as schema's Publisher leaves it with
// CloudEventsMetadata: a wire format payload, the dataschema and content
// type in metadata.
func schemaMessage() *message.Message {
	m := message.NewMessage("u1", append([]byte{0, 0, 0, 0, 7}, 2, 'x'))
	m.Metadata.Set("ce_type", "order.placed")
	m.Metadata.Set(forwarder.DataSchemaMetadata, "http://registry:8081/schemas/ids/7")
	m.Metadata.Set(forwarder.DataContentTypeMetadata, "application/avro")
	return m
}

func headerValues(r *kgo.Record, key string) []string {
	var out []string
	for _, h := range r.Headers {
		if h.Key == key {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// Binary mode: the dataschema is header ce_dataschema and the message's
// content type header content-type (over Config's DataContentType), each
// once: the metadata headers of the same names give way to them.
func TestCloudEventBinaryCarriesTheDataSchema(t *testing.T) {
	cfg := forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop", DataContentType: "application/json"}
	m := schemaMessage()
	r, err := DefaultMarshaler{}.Marshal("orders", m)
	if err != nil {
		t.Fatal(err)
	}
	if err := cloudEvent(cfg, r, m, false); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"ce_dataschema": "http://registry:8081/schemas/ids/7", "content-type": "application/avro"} {
		if got := headerValues(r, key); len(got) != 1 || got[0] != want {
			t.Errorf("header %s: %q, want [%q]; headers %v", key, got, want, r.Headers)
		}
	}
	if got := headerValues(r, "ce_datacontenttype"); got != nil {
		t.Errorf("header ce_datacontenttype %q: the binding reads the content type from content-type only", got)
	}
	if string(r.Value) != string(m.Payload) {
		t.Errorf("value %q", r.Value)
	}
}

// Structured mode: members dataschema and datacontenttype, the wire format
// payload (no JSON) in data_base64.
func TestCloudEventStructuredCarriesTheDataSchema(t *testing.T) {
	cfg := forwarder.CloudEvents{Mode: forwarder.CloudEventsStructured, Source: "/shop", DataContentType: "application/json"}
	m := schemaMessage()
	m.Metadata.Set(forwarder.DataContentTypeMetadata, "application/json") // a JSON Schema record: still no JSON in the wire format
	r, err := DefaultMarshaler{}.Marshal("orders", m)
	if err != nil {
		t.Fatal(err)
	}
	if err := cloudEvent(cfg, r, m, false); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(r.Value, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["dataschema"] != "http://registry:8081/schemas/ids/7" || doc["datacontenttype"] != "application/json" || doc["data_base64"] != base64.StdEncoding.EncodeToString(m.Payload) {
		t.Fatalf("event %s", r.Value)
	}
	if got := headerValues(r, "ce_dataschema"); got != nil {
		t.Fatalf("header ce_dataschema %q in structured mode", got)
	}
}

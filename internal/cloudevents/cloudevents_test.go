package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestOf(t *testing.T) {
	cfg := forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop"}
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	m := message.NewMessage("uuid-1", nil)
	m.Metadata.Set("ce_type", "order.placed")
	if e, err := Of(cfg, m, "", now); err != nil || e.ID != "uuid-1" || e.Time != "2025-01-02T02:04:05Z" || e.Subject != "" {
		t.Fatalf("no outbox id: %+v, %v", e, err)
	}
	m.Metadata.Set(outbox.MetadataID, "orders/3/17")
	m.Metadata.Set(outbox.MetadataSource, "eu")
	if e, err := Of(cfg, m, "k", now); err != nil || e.ID != "eu:orders/3/17" || e.Subject != "k" {
		t.Fatalf("from a source: %+v, %v", e, err)
	}
	if _, err := Of(cfg, m, "a\nb", now); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("a key with a newline: %v", err)
	}
	cfg.Type = func(*message.Message) string { return "" }
	if _, err := Of(cfg, m, "k", now); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Type gives none: %v", err)
	}
}

func TestStructured(t *testing.T) {
	e := Event{ID: "i", Source: "/s", Type: "t", Time: "2025-01-02T02:04:05Z", DataContentType: "application/vnd.x+json"}
	for payload, want := range map[string]string{
		`{"a":1}`: `"data":{"a":1}`,
		`nope`:    `"data_base64":"bm9wZQ=="`,
		``:        `"time":"2025-01-02T02:04:05Z","datacontenttype":"application/vnd.x+json"}`,
	} {
		b, err := Structured(e, []byte(payload))
		if err != nil || !json.Valid(b) || !strings.Contains(string(b), want) {
			t.Errorf("payload %q: %s, %v; want it to hold %s", payload, b, err, want)
		}
	}
}

func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"orders/0/5":  "orders/0/5",
		`a "b" 50%`:   "a%20%22b%22%2050%25",
		"clé":         "cl%C3%A9",
		"tab\there":   "tab%09here",
		"~!#$&'()*+,": "~!#$&'()*+,",
	} {
		if got := PercentEncode(in); got != want {
			t.Errorf("PercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
}

// Metadata ce_dataschema is the event's dataschema and ce_datacontenttype
// its datacontenttype (over CloudEvents.DataContentType); both are allowed
// in metadata where other ce_ keys are refused, and a value that is no
// absolute URI or no media type rejects the message.
func TestOfReadsDataSchemaAndContentTypeFromMetadata(t *testing.T) {
	cfg := forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop", DataContentType: "application/json"}
	m := message.NewMessage("uuid-1", nil)
	m.Metadata.Set("ce_type", "order.placed")
	if e, err := Of(cfg, m, "", time.Now()); err != nil || e.DataSchema != "" || e.DataContentType != "application/json" {
		t.Fatalf("without the metadata: %+v, %v", e, err)
	}
	m.Metadata.Set(forwarder.DataSchemaMetadata, "http://registry:8081/schemas/ids/7")
	m.Metadata.Set(forwarder.DataContentTypeMetadata, "application/avro")
	e, err := Of(cfg, m, "", time.Now())
	if err != nil || e.DataSchema != "http://registry:8081/schemas/ids/7" || e.DataContentType != "application/avro" {
		t.Fatalf("with the metadata: %+v, %v", e, err)
	}
	if got := e.Attributes(); got[len(got)-2] != (Attr{"datacontenttype", "application/avro"}) || got[len(got)-1] != (Attr{"dataschema", "http://registry:8081/schemas/ids/7"}) {
		t.Fatalf("attributes %v", got)
	}
	for _, prefix := range []string{"ce_", "ce-"} {
		if err := CheckMetadata(cfg, m, prefix); err != nil {
			t.Fatalf("CheckMetadata %q: %v", prefix, err)
		}
	}
	if err := CheckMetadata(cfg, m, "ce_"); err != nil || !Consumed(cfg, "ce_dataschema") || !Consumed(cfg, "ce_datacontenttype") || Consumed(cfg, "ce_traceparent") {
		t.Fatalf("the keys are not consumed: %v", err)
	}
	for key, bad := range map[string][]string{
		forwarder.DataSchemaMetadata:      {"schemas/ids/7", "/schemas/ids/7", "http://registry/schemas/ids/7#x", "http://registry/a b", "http://[::1", "http://registry/\x01"},
		forwarder.DataContentTypeMetadata: {"avro", "application/", "application/avro; =x", "text/plain\x01"},
	} {
		for _, v := range bad {
			b := message.NewMessage("uuid-2", nil)
			b.Metadata.Set("ce_type", "order.placed")
			b.Metadata.Set(key, v)
			var me *outboxtype.MessageError
			if _, err := Of(cfg, b, "", time.Now()); !errors.Is(err, outbox.ErrInvalidMessage) || !errors.As(err, &me) || me.UUID != "uuid-2" || !strings.Contains(err.Error(), key) {
				t.Errorf("%s %q: %v, want a *MessageError naming the key", key, v, err)
			}
		}
	}
	for _, v := range []string{"urn:shop:schemas:7", "https://registry.example/subjects/orders-value/versions/3?x=1"} {
		b := message.NewMessage("uuid-3", nil)
		b.Metadata.Set("ce_type", "order.placed")
		b.Metadata.Set(forwarder.DataSchemaMetadata, v)
		if e, err := Of(cfg, b, "", time.Now()); err != nil || e.DataSchema != v {
			t.Errorf("%q: %+v, %v", v, e, err)
		}
	}
}

// In structured mode the dataschema is a member, and a payload in the
// schema registry's wire format (magic byte 0, schema id, record) goes to
// data_base64 even with a JSON datacontenttype: it is no JSON.
func TestStructuredDataSchemaAndWireFormat(t *testing.T) {
	e := Event{ID: "i", Source: "/s", Type: "t", Time: "2025-01-02T02:04:05Z", DataContentType: "application/json", DataSchema: "http://registry:8081/schemas/ids/7"}
	wire := append([]byte{0, 0, 0, 0, 7}, `{"a":1}`...)
	b, err := Structured(e, wire)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["dataschema"] != e.DataSchema || doc["datacontenttype"] != "application/json" || doc["data_base64"] != base64.StdEncoding.EncodeToString(wire) || doc["data"] != nil {
		t.Fatalf("event %s", b)
	}
}

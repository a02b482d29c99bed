package cloudevents

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
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

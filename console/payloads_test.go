package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"html/template"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// The schemas of the tests' topics: orders-… Avro, notes-… JSON Schema.
const (
	orderSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string"}]}`
	noteSchema  = `{"title":"Note","type":"object","properties":{"note":{"type":"string"}},"required":["note"]}`
)

// A dead letter's payload in the wire format (an Avro record published
// through the schema Publisher) is shown decoded as JSON beside its raw
// bytes, escaped (a <script> in a string is text); when the registry
// cannot be reached the page says why and still shows the raw bytes.
func TestDeadLetterPayloadIsShownDecodedWithItsSchema(t *testing.T) {
	ctx := context.Background()
	reg := schematest.New(t)
	cl := reg.Client(t)
	orders, notes := reg.Name(t, "orders"), reg.Name(t, "notes") // subjects of their own, on a shared registry too
	codec, err := schema.New(ctx, schema.Config{Client: cl, Schemas: []schema.TopicSchema{
		{Topic: orders, Format: schema.Avro, Text: orderSchema}, {Topic: notes, Format: schema.JSONSchema, Text: noteSchema}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := schema.New(ctx, schema.Config{Client: cl}, nil) // decodes only, as a console's is
	if err != nil {
		t.Fatal(err)
	}
	f := consoletest.NewWith(t, false, "", func(c *console.Config) { c.Payloads = reader })

	f.B.Register(orders, 1)
	f.B.Register(notes, 1)
	pub, err := codec.Publisher(f.B.Publisher(nil))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := codec.NewMessage(orders, map[string]any{"id": "o-1", "note": consoletest.Hostile})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(orders, msg); err != nil {
		t.Fatal(err)
	}
	var note bytes.Buffer
	enc := json.NewEncoder(&note)
	enc.SetEscapeHTML(false) // the markup as it is, not \u003c
	if err := enc.Encode(map[string]string{"note": consoletest.Hostile}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(notes, message.NewMessage("n-1", note.Bytes())); err != nil {
		t.Fatal(err)
	}
	entry := deadLetter(t, f.B, orders)

	id := consoletest.Itoa(entry.ID)
	text, schemaID, ok, err := reader.JSON(ctx, entry.Payload)
	if err != nil || !ok {
		t.Fatalf("the dead letter's payload is not in the wire format: %v %v", ok, err)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, text, "", "  "); err != nil {
		t.Fatal(err)
	}

	code, page := f.Get(t, "/dlq/"+id)
	if code != http.StatusOK {
		t.Fatalf("GET /dlq/%s: %d\n%s", id, code, page)
	}
	if !strings.Contains(page, "decoded with schema id "+consoletest.Itoa(int64(schemaID))) || !strings.Contains(page, template.HTMLEscapeString(indented.String())) {
		t.Fatalf("the page does not show the payload decoded as JSON (%s):\n%s", indented.String(), page)
	}
	raw := `id="payload-size">` + consoletest.Itoa(int64(len(entry.Payload))) + ` B of binary data, not shown · <a href="/dlq/` + id + `/payload"`
	if !strings.Contains(page, raw) {
		t.Error("the page does not show the raw bytes (their size and download) beside the JSON")
	}
	if strings.Contains(page, "<script>window") || strings.Contains(page, "<img src=x") {
		t.Fatal("the decoded JSON is not escaped")
	}

	// A JSON Schema record holds the markup as it is: shown as text.
	code, page = f.Get(t, "/dlq/"+consoletest.Itoa(deadLetter(t, f.B, notes).ID))
	if code != http.StatusOK || !strings.Contains(page, template.HTMLEscapeString(`"note": "<script>window.__pwned=1</script>`)) || strings.Contains(page, "<script>window") {
		t.Fatalf("the page (%d) does not show a JSON Schema record's markup escaped:\n%s", code, page)
	}

	// A registry that cannot be reached: the page says why, with the raw
	// bytes, and is no error page.
	downClient, err := sr.NewClient(sr.URLs(reg.DownURL(t)))
	if err != nil {
		t.Fatal(err)
	}
	blind, err := schema.New(ctx, schema.Config{Client: downClient, Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Pool: f.B.Pool, Schema: f.B.Schema, Payloads: blind}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost/dlq/"+id, nil))
	page = rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(page, `id="payload-json-error"`) || !strings.Contains(page, "registry unavailable") ||
		!strings.Contains(page, raw) || strings.Contains(page, `id="payload-json"`) {
		t.Fatalf("with the registry down, the page (%d) does not say why beside the raw payload:\n%s", rec.Code, page)
	}
}

// deadLetter dead-letters the message published to topic (a consumer
// group "shipping-<topic>" rejects it) and returns its dead letter.
func deadLetter(t *testing.T, b *outboxtest.Bundle, topic string) deadletter.Entry {
	t.Helper()
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.SequenceAll()
	group := "shipping-" + topic
	b.RejectingConsumer(group, topic, store)
	var entry deadletter.Entry
	outboxtest.WaitFor(t, "the message of "+topic+" dead-lettered", 30*time.Second, func() bool {
		page, err := store.List(context.Background(), deadletter.ListOptions{Filter: deadletter.Filter{Group: group}})
		if err != nil || len(page.Entries) == 0 {
			return false
		}
		entry = page.Entries[0]
		return true
	})
	return entry
}

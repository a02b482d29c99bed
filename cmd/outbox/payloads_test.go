package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/schema"
	"github.com/millrace/watermill-outbox/schema/schematest"
)

// orderSchema is the Avro schema of the tests' topic (orders-…).
const orderSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"note","type":"string"}]}`

// dlq show and held list, given a schema registry (--schema-registry or
// the --config file's schema_registry), show a payload in the wire format
// decoded as JSON beside the raw bytes, and -o json gains payload_json;
// with the registry down, the output says why for the payload and the
// command exits 1 after it.
func TestPayloadsAreShownDecodedWithTheSchemaRegistry(t *testing.T) {
	ctx := context.Background()
	b := outboxtest.Setup(t)
	c := newCLI(t, b.Schema)
	reg := schematest.New(t)
	url, orders := reg.URL, reg.Name(t, "orders") // a subject of its own, on a shared registry too
	b.Register(orders, 1)
	codec, err := schema.New(ctx, schema.Config{Client: reg.Client(t), Schemas: []schema.TopicSchema{{Topic: orders, Format: schema.Avro, Text: orderSchema}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := codec.Publisher(b.Publisher(nil))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := codec.NewMessage(orders, map[string]any{"id": "o-1", "note": "fragile \x1b[2J"})
	if err != nil {
		t.Fatal(err)
	}
	msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, "customer-42")
	if err := pub.Publish(orders, msg); err != nil {
		t.Fatal(err)
	}
	text, schemaID, ok, err := codec.JSON(ctx, msg.Payload)
	if err != nil || !ok {
		t.Fatalf("the published payload is not in the wire format: %v %v", ok, err)
	}
	label := "payload (json, schema id " + strconv.Itoa(schemaID) + ")"
	decoded := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(label) + ` +` + regexp.QuoteMeta(strconv.Quote(string(text))) + `$`)
	raw := regexp.MustCompile(`(?m)^payload +"\\x00\\x00\\x00\\x00`)

	// One group rejects the message (a dead letter), another holds its key.
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.SequenceAll()
	b.RejectingConsumer("shipping", orders, store)
	b.HoldingConsumer("billing", orders, store, "customer-42")
	outboxtest.WaitFor(t, "the message dead-lettered and held", 30*time.Second, func() bool {
		return b.Rows("dead_letters") == 1 && b.Rows("held") == 1
	})
	id := itoa(b.Int("SELECT id FROM " + b.Schema + ".dead_letters"))

	// dlq show: without a registry, the raw payload only.
	if out := c.ok("dlq", "show", id); strings.Contains(out, "payload (json") || !raw.MatchString(out) {
		t.Fatalf("dlq show without a registry:\n%s", out)
	}
	out := c.ok("dlq", "show", id, "--schema-registry", url)
	if !decoded.MatchString(out) || !raw.MatchString(out) || strings.Contains(out, "\x1b") {
		t.Fatalf("dlq show --schema-registry does not show the payload decoded beside the raw bytes (want %s):\n%s", decoded, out)
	}
	var shown struct {
		Payload     []byte
		PayloadJSON struct{ ID, Note string } `json:"payload_json"`
		SchemaID    int                       `json:"payload_schema_id"`
	}
	c.json(&shown, "dlq", "show", id, "--schema-registry", url)
	if shown.PayloadJSON.ID != "o-1" || shown.PayloadJSON.Note != "fragile \x1b[2J" || shown.SchemaID != schemaID || len(shown.Payload) == 0 {
		t.Fatalf("dlq show -o json: %+v", shown)
	}
	// The --config file's schema_registry.
	config := filepath.Join(t.TempDir(), "outbox.yaml")
	if err := os.WriteFile(config, []byte("schema_registry: "+url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("dlq", "show", id, "--config", config); !decoded.MatchString(out) {
		t.Fatalf("dlq show with schema_registry in --config:\n%s", out)
	}

	// serve: the console's dead-letter page shows it decoded too.
	if page := servePage(t, c, "dlq/"+id, "--schema-registry", url); !strings.Contains(page, "decoded with schema id "+strconv.Itoa(schemaID)) ||
		!strings.Contains(page, "&#34;id&#34;: &#34;o-1&#34;") {
		t.Fatalf("serve --schema-registry: the dead-letter page does not show the payload decoded:\n%s", page)
	}

	// held list: the head's payload and its JSON, after the table.
	if out := c.ok("held", "list"); strings.Contains(out, "head of") {
		t.Fatalf("held list without a registry shows the heads:\n%s", out)
	}
	out = c.ok("held", "list", "--schema-registry", url)
	if !strings.Contains(out, `head of key "customer-42": group billing, topic `+orders+`, partition 0, seq 1, uuid `+msg.UUID) || !decoded.MatchString(out) || !raw.MatchString(out) {
		t.Fatalf("held list --schema-registry does not show the head's payload decoded (want %s):\n%s", decoded, out)
	}
	var held []struct {
		Key  string
		Head struct {
			UUID        string
			PayloadJSON struct{ ID string } `json:"payload_json"`
		}
	}
	c.json(&held, "held", "list", "--schema-registry", url)
	if len(held) != 1 || held[0].Head.UUID != msg.UUID || held[0].Head.PayloadJSON.ID != "o-1" {
		t.Fatalf("held list -o json: %+v", held)
	}

	// The registry down: each command still shows everything, says why
	// the payload is not decoded, and exits 1.
	down := reg.DownURL(t)
	for _, args := range [][]string{{"dlq", "show", id}, {"held", "list"}} {
		code, out, errOut := c.run("", append(args, "--schema-registry", down)...)
		if code != exitError || !regexp.MustCompile(regexp.QuoteMeta(label)+` +NOT DECODED: schema: registry unavailable`).MatchString(out) ||
			!raw.MatchString(out) || !strings.Contains(errOut, "1 of 1 payloads in the wire format could not be decoded") {
			t.Fatalf("outbox %s with the registry down: exit %d\n%s\n%s", strings.Join(args, " "), code, out, errOut)
		}
	}
	var failed struct {
		Error string `json:"payload_json_error"`
	}
	code, jsonOut, _ := c.run("", "dlq", "show", id, "--schema-registry", down, "-o", "json")
	if err := json.Unmarshal([]byte(jsonOut), &failed); err != nil || code != exitError || !strings.Contains(failed.Error, "registry unavailable") {
		t.Fatalf("dlq show -o json with the registry down: exit %d, %v\n%s", code, err, jsonOut)
	}
	if code, _, errOut := c.run("", "dlq", "show", id, "--schema-registry", "registry:8081"); code != exitUsage || !strings.Contains(errOut, "is not the URL of a schema registry") {
		t.Fatalf("a --schema-registry that is no URL: exit %d\n%s", code, errOut)
	}
}

// A long JSON rendering is cut as a long payload is, and says so.
func TestALongDecodedPayloadIsCutLikeAPayload(t *testing.T) {
	long := `{"a":"` + strings.Repeat("x", 40<<10) + `"}`
	var b strings.Builder
	printPayload(termsafe.NewWriter(&b), []byte("raw"), &decodedPayload{JSON: json.RawMessage(long), SchemaID: 3})
	out := b.String()
	want := "payload (json, schema id 3)\t" + strconv.Quote(long[:payloadPreviewBytes]) + "… (the first 16384 of " + strconv.Itoa(len(long)) + " bytes: -o json has it whole)\n"
	if !strings.Contains(out, want) || !strings.HasPrefix(out, "payload\t\"raw\"\n") {
		t.Fatalf("a long JSON rendering:\n%.300s", out)
	}
}

// servePage runs outbox serve with args, reads the console's page path,
// and stops it.
func servePage(t *testing.T, c cli, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errOut syncBuffer
	go func() {
		env := func(k string) string {
			if k == "DATABASE_URL" {
				return c.url
			}
			return ""
		}
		done <- execute(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--schema", c.schema}, args...), strings.NewReader(""), &bytes.Buffer{}, &errOut, env)
	}()
	defer func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("serve exited %d after an interrupt: %s", code, errOut.String())
		}
	}()
	var addr string
	outboxtest.WaitFor(t, "the console to listen", 30*time.Second, func() bool {
		m := regexp.MustCompile(`console on (http://[^ ]+/) `).FindStringSubmatch(errOut.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil || strings.Contains(errOut.String(), "Error:")
	})
	if addr == "" {
		t.Fatalf("serve did not start: %s", errOut.String())
	}
	resp, err := http.Get(addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /%s: %d\n%s", path, resp.StatusCode, body)
	}
	return string(body)
}

package console_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A page shows the first characters of a long value and the whole behind
// "show all" (or, past 64 KiB, says where to find it); a payload shows its
// first 16 KiB and downloads whole, as an attachment never rendered.
func TestLongValuesAreCutWithAWayToTheWhole(t *testing.T) {
	f := consoletest.New(t, false)
	m := consoletest.LongDeadLetter()
	id := consoletest.Itoa(f.AddDeadLetter(t, m))

	code, page := f.Get(t, "/dlq/"+id)
	if code != http.StatusOK {
		t.Fatalf("GET /dlq/%s: %d", id, code)
	}
	if len(page) > 400<<10 {
		t.Errorf("the dead-letter page is %d bytes", len(page))
	}
	if strings.Contains(page, "PAYLOAD-END") || strings.Contains(page, "HUGE-END") {
		t.Error("the page carries the whole payload or a value over 64 KiB")
	}
	for _, want := range []string{"KEY-END", "UUID-END", "NOTE-END", "GROUP-END", "TOPIC-END", "MDKEY-END", // behind "show all"
		"show all 54,000 characters", "show all 200,000 characters, 195.3 KiB", "-o json output has it whole",
		"976.6 KiB, the first 16.0 KiB shown", `href="/dlq/` + id + `/payload"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the dead-letter page does not show %q", want)
		}
	}

	resp, err := f.Client.Get(f.Server.URL + "/dlq/" + id + "/payload")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h := resp.Header
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, m.Payload) || h.Get("Content-Type") != "application/octet-stream" ||
		h.Get("Content-Disposition") != `attachment; filename="dead-letter-`+id+`.payload"` || h.Get("X-Content-Type-Options") != "nosniff" ||
		!strings.HasPrefix(h.Get("Content-Security-Policy"), "sandbox") {
		t.Fatalf("payload download: %d, %d bytes (want %d), headers %v", resp.StatusCode, len(body), len(m.Payload), h)
	}

	// A binary payload is not shown, and downloads byte for byte.
	bin := f.AddDeadLetter(t, outboxtype.RejectedMessage{Payload: []byte{0xff, 0x00, '<', 'b', '>', 0xfe}})
	if _, page := f.Get(t, "/dlq/"+consoletest.Itoa(bin)); !strings.Contains(page, "6 B of binary data, not shown") {
		t.Error("a binary payload is not said to be binary")
	}
	if _, body := f.Get(t, "/dlq/"+consoletest.Itoa(bin)+"/payload"); body != "\xff\x00<b>\xfe" {
		t.Errorf("binary payload downloaded as %q", body)
	}
	if code, _ := f.Get(t, "/dlq/999999/payload"); code != http.StatusNotFound {
		t.Errorf("the payload of no dead letter: %d, want 404", code)
	}

	// The list shows each long value cut, the whole on the entry's page.
	code, list := f.Get(t, "/dlq")
	if code != http.StatusOK || len(list) > 32<<10 {
		t.Fatalf("GET /dlq: %d, %d bytes", code, len(list))
	}
	if strings.Contains(list, "UUID-END") || strings.Contains(list, "REASON-END") || !strings.Contains(list, "xxxx…") {
		t.Error("the list does not cut long values")
	}
	// The confirmation page names a long key cut, and posts it whole.
	key := consoletest.LongText(54_000, "KEY-END")
	_, confirm := consoletest.New(t, true).Get(t, "/confirm/retry-held?group=billing&topic=orders&partition=0&key="+key)
	if strings.Count(confirm, "KEY-END") != 1 || !strings.Contains(confirm, `key &#34;xxxx`) {
		t.Error("the confirmation page does not name a long key cut, or does not post it whole")
	}
}

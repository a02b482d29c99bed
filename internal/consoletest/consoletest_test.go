package consoletest_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/internal/consoletest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The fixture is what its tests take it for: the hostile dead letter is
// Entry, the console is mounted under the prefix and edited as asked, a
// dead letter added gets the defaults and a new id, and the CSRF token a
// page carries lets an authorized action through.
func TestTheFixtureServesTheConsoleItDescribes(t *testing.T) {
	var edited bool
	f := consoletest.NewWith(t, true, "/outbox", func(c *console.Config) { edited = c.EnableActions && c.Token != "" && c.Prefix == "/outbox" })
	if !edited {
		t.Fatal("edit was not called with the fixture's configuration")
	}
	if f.B.Int("SELECT count(*) FROM "+f.B.Schema+".dead_letters WHERE id = $1 AND payload = $2", f.Entry, []byte(consoletest.Hostile)) != 1 {
		t.Fatal("Entry is not the hostile dead letter")
	}
	if code, _ := f.Get(t, "/dlq/"+consoletest.Itoa(f.Entry)); code != http.StatusNotFound {
		t.Fatalf("GET outside the prefix: %d, want 404", code)
	}
	if code, body := f.Get(t, "/outbox/dlq/"+consoletest.Itoa(f.Entry)); code != http.StatusOK || !strings.Contains(body, "evil-&lt;script&gt;") {
		t.Fatalf("GET under the prefix: %d", code)
	}
	if code, _ := f.Do(t, http.MethodGet, "/outbox/dlq", "evil.example", nil, nil); code != http.StatusMisdirectedRequest {
		t.Fatalf("Do for another host: %d, want 421", code)
	}

	id := f.AddDeadLetter(t, outboxtype.RejectedMessage{})
	if id <= f.Entry || f.B.Int("SELECT count(*) FROM "+f.B.Schema+".dead_letters WHERE id = $1 AND group_name = 'billing' AND topic = 'orders' AND uuid <> ''", id) != 1 {
		t.Fatalf("AddDeadLetter: id %d (Entry %d), without the default group, topic or uuid", id, f.Entry)
	}
	resp := f.Post(t, "/outbox/actions/discard", url.Values{"id": {consoletest.Itoa(id)}, "csrf": {f.CSRF(t)}, "confirm": {"yes"}},
		map[string]string{"Authorization": "Bearer " + f.Token})
	if resp.StatusCode != http.StatusSeeOther || f.B.Int("SELECT count(*) FROM "+f.B.Schema+".dead_letters WHERE id = $1 AND status = 'discarded'", id) != 1 {
		t.Fatalf("an authorized discard with the page's CSRF token: %d", resp.StatusCode)
	}

	m := consoletest.LongDeadLetter()
	if len(m.Payload) != 1_000_000 || !strings.HasSuffix(string(m.Payload), "PAYLOAD-END"+consoletest.Hostile) || len(m.PartitionKey) != 54_000 {
		t.Fatalf("LongDeadLetter: a %d-byte payload, a %d-byte key", len(m.Payload), len(m.PartitionKey))
	}
}

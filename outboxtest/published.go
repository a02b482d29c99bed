// Package outboxtest helps applications test code that publishes through the
// outbox and code that consumes from it, against a real PostgreSQL:
//
//   - RequirePublished, RequirePublishedTx and RequireNotPublished assert
//     what a topic holds (sequenced or not, and, through the test's own
//     transaction, not yet committed), matched by partition key, metadata,
//     payload or decoded JSON, and list what was published when they fail;
//   - Runner (RunUntilIdle, Tick) sequences what was committed and delivers
//     it to a handler in the calling goroutine with the Subscriber's own
//     workers, leases and cursors, and returns when nothing is left: no
//     sleeps in tests, no goroutine left behind;
//   - Schema gives a test its own migrated schema on an existing database,
//     dropped at cleanup, so that parallel tests do not see each other.
//
// It depends on the standard testing package and this library only.
// docs/testing.md shows how an application uses it.
package outboxtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
)

// Published is a message a topic holds, as RequirePublished returns it.
type Published struct {
	Topic     string
	Partition int
	// Seq is the message's place in its partition; 0 while it waits for
	// the sequencer (or its transaction has not committed yet).
	Seq       int64
	Key       string // partition key, "" for none
	UUID      string
	Metadata  map[string]string
	Payload   []byte
	CreatedAt time.Time
}

// Match narrows what the Require functions look for (Key, Metadata, UUID,
// Payload, JSON, Where), how many they want (Times), or where they look
// (InSchema).
type Match func(*query)

type query struct {
	schema    string
	preds     []predicate
	times     int  // -1: at least one
	sequenced bool // only messages the sequencer (or relay) has numbered
}

type predicate struct {
	desc string
	ok   func(Published) bool
}

func where(desc string, ok func(Published) bool) Match {
	return func(q *query) { q.preds = append(q.preds, predicate{desc, ok}) }
}

// InSchema looks in the outbox schema name (default outbox.DefaultSchema).
func InSchema(name string) Match { return func(q *query) { q.schema = name } }

// Key matches messages with partition key k.
func Key(k string) Match {
	return where(fmt.Sprintf("key %q", k), func(p Published) bool { return p.Key == k })
}

// UUID matches the message with this uuid.
func UUID(id string) Match {
	return where(fmt.Sprintf("uuid %q", id), func(p Published) bool { return p.UUID == id })
}

// Metadata matches messages whose metadata has key set to value.
func Metadata(key, value string) Match {
	return where(fmt.Sprintf("metadata %s=%q", key, value), func(p Published) bool {
		v, ok := p.Metadata[key]
		return ok && v == value
	})
}

// Payload matches messages whose payload ok accepts; desc says what it
// checks, for the failure message.
func Payload(desc string, ok func(payload []byte) bool) Match {
	if ok == nil {
		return where("payload "+desc, nil) // refused by the Require functions
	}
	return where("payload "+desc, func(p Published) bool { return ok(p.Payload) })
}

// PayloadEquals matches messages whose payload is exactly b.
func PayloadEquals(b []byte) Match {
	return where("payload "+showPayload(b), func(p Published) bool { return bytes.Equal(p.Payload, b) })
}

// JSON matches messages whose payload is JSON containing subset: every
// field of subset (a struct, a map or JSON text) with the same value, the
// payload's other fields ignored, recursively for nested objects; arrays
// and other values must be equal.
func JSON(subset any) Match {
	want, err := toJSONValue(subset)
	desc := fmt.Sprintf("JSON containing %s", compactJSON(want))
	if err != nil {
		desc = fmt.Sprintf("JSON containing an unencodable %T (%v)", subset, err)
	}
	return where(desc, func(p Published) bool {
		if err != nil {
			return false
		}
		var got any
		if json.Unmarshal(p.Payload, &got) != nil {
			return false
		}
		return contains(got, want)
	})
}

// Where matches messages ok accepts; desc says what it checks.
func Where(desc string, ok func(Published) bool) Match { return where(desc, ok) }

// Sequenced matches only messages that have been sequenced: numbered in
// their partition (Seq > 0) by a Sequencer (table mode) or appended by a
// relay (log-based mode), so that a consumer can read them. Without it a
// committed message waiting in pending matches too: publishing worked, but
// a service that runs no sequencer (every Subscriber with
// DisableSequencer, no outbox.Sequencer or `outbox pipeline`) passes its
// tests and never delivers. Use it where a test runs the delivery side
// (a Runner, a Subscriber) or the whole service; when it fails because
// matching messages still wait, the failure says so.
func Sequenced() Match { return func(q *query) { q.sequenced = true } }

// Times makes RequirePublished want exactly n matching messages (default:
// at least one).
func Times(n int) Match { return func(q *query) { q.times = n } }

// RequirePublished fails t unless topic holds a message matching every
// match (committed: sequenced or waiting for the sequencer), and returns
// the matching messages in order (sequenced ones by partition and seq,
// then the waiting ones as published). db is a *pgxpool.Pool or *sql.DB;
// to see the messages a transaction of the test has not committed, use
// RequirePublishedTx. The failure message lists what topic does hold.
//
// Messages published in outbox.ModeWAL are in the WAL only until a relay
// appends them to the log: RequirePublished sees them after that (e.g.
// after relay.Relay has run), RequirePublishedTx never before commit.
func RequirePublished(t testing.TB, db any, topic string, match ...Match) []Published {
	t.Helper()
	return require(t, db, topic, true, match)
}

// RequirePublishedTx is RequirePublished through tx (a pgx.Tx, *sql.Tx or
// watermill-sql transaction): it sees the messages tx published and has
// not committed, with those committed before.
func RequirePublishedTx(t testing.TB, tx any, topic string, match ...Match) []Published {
	t.Helper()
	return require(t, tx, topic, true, match)
}

// RequireNotPublished fails t if topic holds a message matching every
// match, listing the ones it found. db is a pool, *sql.DB or a
// transaction (whose own messages it then sees).
func RequireNotPublished(t testing.TB, db any, topic string, match ...Match) {
	t.Helper()
	require(t, db, topic, false, match)
}

// maxListed bounds the messages read per topic and listed in a failure.
const (
	maxRead   = 10000
	maxListed = 20
)

func require(t testing.TB, db any, topic string, want bool, match []Match) []Published {
	t.Helper()
	q := query{schema: names.DefaultSchema, times: -1}
	for i, m := range match {
		if m == nil {
			t.Fatalf("outboxtest: match %d (0-based) is nil", i)
			return nil
		}
		m(&q)
	}
	for _, pr := range q.preds {
		if pr.ok == nil {
			t.Fatalf("outboxtest: the match on %s has a nil func", pr.desc)
			return nil
		}
	}
	all, err := readTopic(context.Background(), db, q.schema, topic)
	if err != nil {
		t.Fatalf("outboxtest: read topic %q: %v", topic, err)
		return nil
	}
	var got, waiting []Published
	for _, p := range all {
		switch {
		case !q.matches(p):
		case q.sequenced && p.Seq == 0:
			waiting = append(waiting, p)
		default:
			got = append(got, p)
		}
	}
	switch {
	case want && q.times < 0 && len(got) == 0:
		t.Fatalf("outboxtest: no message of topic %q matches %s;%s\n%s", topic, q.describe(), q.unsequenced(waiting), list(all, "topic holds"))
	case want && q.times >= 0 && len(got) != q.times && len(got) == 0:
		t.Fatalf("outboxtest: no message of topic %q matches %s, want %d;%s\n%s", topic, q.describe(), q.times, q.unsequenced(waiting), list(all, "topic holds"))
	case want && q.times >= 0 && len(got) != q.times:
		t.Fatalf("outboxtest: %d messages of topic %q match %s, want %d;%s\n%s", len(got), topic, q.describe(), q.times, q.unsequenced(waiting), list(got, "matching"))
	case !want && len(got) > 0:
		t.Fatalf("outboxtest: %d messages of topic %q match %s, want none;\n%s", len(got), topic, q.describe(), list(got, "matching"))
	}
	return got
}

func (q query) matches(p Published) bool {
	for _, pr := range q.preds {
		if !pr.ok(p) {
			return false
		}
	}
	return true
}

func (q query) describe() string {
	parts := make([]string, 0, len(q.preds)+1)
	for _, p := range q.preds {
		parts = append(parts, p.desc)
	}
	if q.sequenced {
		parts = append(parts, "sequenced")
	}
	if len(parts) == 0 {
		return "anything"
	}
	return strings.Join(parts, " and ")
}

// unsequenced explains, for a failure, the matching messages left out
// because no sequencer has numbered them yet.
func (q query) unsequenced(waiting []Published) string {
	if len(waiting) == 0 {
		return ""
	}
	return fmt.Sprintf(" %d message(s) match all but \"sequenced\": committed, and waiting for a sequencer that has not run (is one running: a Subscriber without DisableSequencer, an outbox.Sequencer, `outbox pipeline`; in ModeWAL, a relay?)", len(waiting))
}

// list renders up to maxListed messages for a failure message.
func list(ps []Published, what string) string {
	if len(ps) == 0 {
		return what + " no message"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %d message(s):", what, len(ps))
	for i, p := range ps {
		if i == maxListed {
			fmt.Fprintf(&sb, "\n  … and %d more", len(ps)-maxListed)
			break
		}
		seq := "pending"
		if p.Seq > 0 {
			seq = fmt.Sprintf("seq %d", p.Seq)
		}
		keys := make([]string, 0, len(p.Metadata))
		for k := range p.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		md := make([]string, len(keys))
		for j, k := range keys {
			md[j] = fmt.Sprintf("%s=%q", k, p.Metadata[k])
		}
		fmt.Fprintf(&sb, "\n  - uuid %q key %q partition %d %s metadata {%s} payload %s", p.UUID, p.Key, p.Partition, seq, strings.Join(md, " "), showPayload(p.Payload))
	}
	return sb.String()
}

// showPayload shows a payload in a failure message: printable text as it
// is between backquotes (JSON stays readable), anything else quoted with
// Go escapes; the first 120 bytes of it.
func showPayload(b []byte) string {
	more := ""
	if len(b) > 120 {
		n := 120
		for n > 0 && !utf8.RuneStart(b[n]) { // do not cut a character
			n--
		}
		b, more = b[:n], "…"
	}
	if s := string(b); strconv.CanBackquote(s) {
		return "`" + s + "`" + more
	}
	return strconv.Quote(string(b)) + more
}

func readTopic(ctx context.Context, db any, schema, topic string) ([]Published, error) {
	if err := names.Schema(schema); err != nil {
		return nil, err
	}
	q, err := pgexec.FromTx(db)
	if err != nil {
		d, derr := pgexec.FromDB(db)
		if derr != nil {
			return nil, fmt.Errorf("want a pool, *sql.DB or transaction, got %T", db)
		}
		q = d
	}
	rows, err := q.Query(ctx, dbsql.For(schema).PublishedOfTopic, topic, maxRead)
	if err != nil {
		return nil, schemacheck.Wrap(err, schema)
	}
	defer rows.Close()
	var out []Published
	for rows.Next() {
		var (
			p   = Published{Topic: topic}
			seq sql.NullInt64
			md  string
			prt int32
		)
		if err := rows.Scan(&seq, &prt, &p.Key, &p.UUID, &md, &p.Payload, &p.CreatedAt); err != nil {
			return nil, err
		}
		p.Seq, p.Partition = seq.Int64, int(prt)
		if err := json.Unmarshal([]byte(md), &p.Metadata); err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", p.UUID, err)
		}
		out = append(out, p)
	}
	return out, schemacheck.Wrap(rows.Err(), schema)
}

// toJSONValue turns subset into the generic JSON value encoding/json
// decodes to: JSON text as is, anything else marshalled.
func toJSONValue(subset any) (any, error) {
	var raw []byte
	switch s := subset.(type) {
	case string:
		raw = []byte(s)
	case []byte:
		raw = s
	case json.RawMessage:
		raw = s
	default:
		var err error
		if raw, err = json.Marshal(subset); err != nil {
			return nil, err
		}
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}

func compactJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// contains reports whether got holds want: objects field by field
// (recursively), everything else equal.
func contains(got, want any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return reflect.DeepEqual(got, want)
	}
	gm, ok := got.(map[string]any)
	if !ok {
		return false
	}
	for k, wv := range wm {
		gv, ok := gm[k]
		if !ok || !contains(gv, wv) {
			return false
		}
	}
	return true
}

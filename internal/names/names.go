// Package names validates and quotes the names the outbox puts into SQL,
// and names this process (Instance).
// Schema names become identifiers (validated, then quoted); topic names are
// always bind parameters, but are validated so that they map cleanly onto
// Kafka topics and NATS subjects; consumer group names are bind parameters
// too, and are validated so that they show as they are wherever an
// operator reads them (status, logs, metric labels, the console).
package names

import (
	"fmt"
	"os"
	"strconv"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DefaultSchema is the schema the outbox uses unless configured otherwise.
const DefaultSchema = "watermill_outbox"

// MaxSchemaLen leaves room for the suffixes of notification channel names
// within PostgreSQL's 63-byte identifier limit.
const MaxSchemaLen = 48

// MaxTopicLen matches Kafka's topic name limit.
const MaxTopicLen = 249

// Schema validates a schema name: lower-case ASCII letters, digits and
// underscores, starting with a letter or underscore, at most MaxSchemaLen
// bytes, and not a system schema: information_schema, or a name with the
// pg_ prefix PostgreSQL reserves (pg_catalog, pg_toast, pg_temp_3, ...).
// Every entry point validates its schema with it, so none of them ever
// creates or writes outbox tables in a system schema.
func Schema(name string) error {
	bad := func(reason string) error { return &outboxtype.NameError{Kind: "schema", Name: name, Reason: reason} }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxSchemaLen:
		return bad("longer than 48 bytes")
	case len(name) >= 3 && name[:3] == "pg_":
		return bad("the pg_ prefix is reserved by PostgreSQL for system schemas; use a schema of your own, e.g. " + DefaultSchema)
	case name == "information_schema":
		return bad("a system schema of PostgreSQL; use a schema of your own, e.g. " + DefaultSchema)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c >= 'a' && c <= 'z' || c == '_'
		if !letter && !(i > 0 && c >= '0' && c <= '9') {
			return bad("use lower-case letters, digits and underscores, starting with a letter or underscore")
		}
	}
	return nil
}

// Topic validates a topic name: 1 to 249 bytes of ASCII letters, digits,
// '.', '_' and '-', the characters Kafka accepts in topic names.
func Topic(name string) error {
	bad := func(reason string) error { return &outboxtype.NameError{Kind: "topic", Name: name, Reason: reason} }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxTopicLen:
		return bad("longer than 249 bytes")
	case name == "." || name == "..":
		return bad("reserved")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad("use ASCII letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}

// MaxSourceLen is the longest source name, in bytes.
const MaxSourceLen = 64

// Source validates the name of a source (one database a forwarder reads,
// pipeline.Fleet): 1 to 64 bytes of ASCII letters, digits, '.', '_' and
// '-'. It goes into Kafka transactional ids, record headers, NATS message
// ids and metric labels as it is, so it holds nothing any of them would
// have to escape, and no '/' or '=' (the separators of a transactional
// id).
func Source(name string) error {
	bad := func(reason string) error { return &outboxtype.NameError{Kind: "source", Name: name, Reason: reason} }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxSourceLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxSourceLen))
	case name == "." || name == "..":
		return bad("reserved (a path segment where the console shows the source)")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return bad("use ASCII letters, digits, '.', '_' and '-', e.g. the shard's name")
		}
	}
	return nil
}

// MaxGroupLen is the longest consumer group name, in bytes.
const MaxGroupLen = 200

// Group validates a consumer group name: 1 to 200 bytes of UTF-8 without a
// NUL, a control character (C0, DEL, C1: an escape sequence, a carriage
// return, a line feed, a tab) or a format character (a bidirectional
// override or isolate, a zero-width character: termsafe.Unsafe), which a
// terminal would act on or hide instead of showing. Any other character,
// spaces and non-ASCII letters included, is allowed.
//
// It is checked where a group is created (SubscriberConfig.ConsumerGroup),
// not where one is looked up: an operator can still find, reset and delete
// a group an older release stored with such a name.
func Group(name string) error {
	bad := func(reason string) error { return &outboxtype.NameError{Kind: "group", Name: name, Reason: reason} }
	switch {
	case name == "":
		return bad("empty")
	case len(name) > MaxGroupLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxGroupLen))
	case !utf8.ValidString(name):
		return bad("not valid UTF-8")
	}
	for i, r := range name {
		if termsafe.Unsafe(r) {
			kind := "control"
			if r >= 0xA0 {
				kind = "format"
			}
			return bad(fmt.Sprintf("the %s character %U at byte %d would act on or hide text where the name is shown (a terminal, a log); use printable characters", kind, r, i))
		}
	}
	return nil
}

// Quote returns the schema name quoted as an SQL identifier.
func Quote(schema string) string { return pgx.Identifier{schema}.Sanitize() }

// WALPrefix is the prefix of the log-based mode's records
// (pg_logical_emit_message) for schema: a relay takes only its schema's.
func WALPrefix(schema string) string { return "watermill-outbox:" + schema }

// PendingChannel is the notification channel publishers use to wake the
// sequencer of schema.
func PendingChannel(schema string) string { return schema + "_pending" }

// RelayedPayload is the payload of the log-based relay's notifications on
// PendingChannel: it put messages of forwarder-only topics into pending,
// in a batch its own pace already made, so their forwarders read at once
// rather than after their own pace (and the sequencer, which leaves them
// alone, need not look).
const RelayedPayload = "relay"

// SequencedChannel is the notification channel the sequencer uses to wake
// subscribers of schema; the payload names the topic and the partitions
// that got new messages: "topic:0,5,7".
func SequencedChannel(schema string) string { return schema + "_sequenced" }

// MembersChannel is the notification channel on which a consumer group's
// changes are announced to its lease managers: a member joined or left,
// an operator paused, resumed or reset partitions. The payload is
// MembersPayload's.
func MembersChannel(schema string) string { return schema + "_members" }

// MembersPayload is the payload of a notification on MembersChannel about
// group's members of topic (every topic of the group when topic is ""):
// "topic:group" (a topic holds no ':').
func MembersPayload(group, topic string) string { return topic + ":" + group }

// Instance names this process: host:pid, the host name with every byte
// outside printable ASCII replaced by '?' and cut so that the whole fits
// in maxLen bytes ("unknown-host" when the host has no name).
func Instance(maxLen int) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	b := []byte(host)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	if len(b) > maxLen-len(pid) {
		b = b[:max(maxLen-len(pid), 0)]
	}
	return string(b) + pid
}

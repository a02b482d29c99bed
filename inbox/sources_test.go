package inbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// from is msg as a forwarder of source sends it.
func from(source string, msg *message.Message) *message.Message {
	msg.UUID = source + ":" + msg.UUID
	msg.Metadata.Set(outbox.MetadataSource, source)
	return msg
}

// Two databases number their messages alike: forwarded by a fleet, each
// source has its own mark, so that neither's message is taken for a
// duplicate of the other's; within a source, duplicates are dropped.
func TestEachSourceHasItsOwnMark(t *testing.T) {
	e := newEnv(t, inbox.Config{})
	steps := []struct {
		msg  *message.Message
		took bool
	}{
		{from("eu", at("orders", 0, 5, 7)), true},
		{from("us", at("orders", 0, 1, 7)), true}, // below eu's mark, but us's first
		{from("us", at("orders", 0, 1, 7)), false},
		{from("eu", at("orders", 0, 5, 7)), false},
		{at("orders", 0, 1, 7), true}, // a forwarder without a source: its own mark too
	}
	for i, s := range steps {
		took, err := e.process(t, s.msg)
		if err != nil || took != s.took {
			t.Fatalf("step %d (%s): took %v, err %v; want took %v", i, s.msg.UUID, took, err, s.took)
		}
	}
}

// A table of a release before sources is upgraded by Migrate: its marks
// become those of source ” and go on dropping duplicates.
func TestMigrateUpgradesATableWithoutSources(t *testing.T) {
	b := outboxtest.Setup(t)
	schema := b.Schema + "_inbox"
	b.Exec(`CREATE SCHEMA ` + schema)
	b.Exec(`CREATE TABLE ` + schema + `.inbox_marks (consumer text NOT NULL, topic text NOT NULL, partition integer NOT NULL,
		incarnation bigint NOT NULL, seq bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, topic, partition))`)
	b.Exec(`INSERT INTO ` + schema + `.inbox_marks (consumer, topic, partition, incarnation, seq) VALUES ('billing', 'orders', 0, 7, 3)`)
	for range 2 { // and again: idempotent
		if err := inbox.Migrate(context.Background(), b.Pool, schema); err != nil {
			t.Fatal(err)
		}
	}
	in, err := inbox.New(inbox.Config{Pool: b.Pool, Schema: schema, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	b.Exec("CREATE TABLE " + b.Schema + ".effects (id bigint GENERATED ALWAYS AS IDENTITY, msg text NOT NULL)")
	e := env{b: b, in: in}
	if took, err := e.process(t, at("orders", 0, 3, 7)); took || err != nil {
		t.Fatalf("a duplicate of a mark from before the upgrade: took %v, err %v", took, err)
	}
	if took, err := e.process(t, from("eu", at("orders", 0, 3, 7))); !took || err != nil {
		t.Fatalf("a source's first message: took %v, err %v", took, err)
	}
}

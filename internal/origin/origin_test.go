package origin_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/origin"
)

func delivered(topic, partition, seq string) *message.Message {
	m := message.NewMessage("u-"+partition+"-"+seq, nil)
	m.Metadata.Set(outbox.MetadataTopic, topic)
	m.Metadata.Set(outbox.MetadataPartition, partition)
	m.Metadata.Set(outbox.MetadataSeq, seq)
	m.Metadata.Set(outbox.MetadataIncarnation, "inc")
	return m
}

func TestOfReadsTheBatchAndWhatTheForwarderSaid(t *testing.T) {
	base := origin.Origin{Source: "eu", Schema: "s", Group: "g", Partitions: 8}
	o, err := origin.Of(base, []*message.Message{delivered("orders", "3", "7"), delivered("orders", "3", "8")}, "test")
	if err != nil {
		t.Fatal(err)
	}
	want := origin.Origin{Source: "eu", Schema: "s", Group: "g", Partitions: 8, Topic: "orders", Partition: 3, Incarnation: "inc"}
	if o != want {
		t.Fatalf("%+v, want %+v", o, want)
	}
	// Without a Forwarder: schema, group and partition count unknown.
	o, err = origin.Of(origin.Origin{}, []*message.Message{delivered("a/b", "0", "1")}, "test")
	if err != nil || o.Schema != "" || o.Partitions != 0 || o.Topic != "a/b" {
		t.Fatalf("%+v, %v", o, err)
	}
}

func TestOfRefusesWhatIsNotOneOutboxPartition(t *testing.T) {
	noMetadata := message.NewMessage("u", nil)
	for name, batch := range map[string][]*message.Message{
		"no outbox metadata":  {noMetadata},
		"two partitions":      {delivered("orders", "1", "1"), delivered("orders", "2", "2")},
		"two topics":          {delivered("orders", "1", "1"), delivered("payments", "1", "2")},
		"no seq":              {delivered("orders", "1", "")},
		"a seq of 0":          {delivered("orders", "1", "0")},
		"a partition of text": {delivered("orders", "x", "1")},
	} {
		if _, err := origin.Of(origin.Origin{}, batch, "test"); !errors.Is(err, outbox.ErrInvalidArgument) {
			t.Fatalf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestSeqAndPartition(t *testing.T) {
	m := delivered("orders", "5", "42")
	if s, err := origin.Seq(m, "test"); s != 42 || err != nil {
		t.Fatalf("Seq: %d, %v", s, err)
	}
	if p := origin.Partition(m); p != 5 {
		t.Fatalf("Partition: %d", p)
	}
	if p := origin.Partition(message.NewMessage("u", nil)); p != -1 {
		t.Fatalf("Partition without metadata: %d, want -1", p)
	}
}

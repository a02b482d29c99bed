package sim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	kafkatarget "github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/sim"
)

// The Kafka model against the real thing: the same scenario runs through
// the product's kgo driver against kfake (or the cluster of
// OUTBOX_TEST_KAFKA_BROKERS) and through the simulator's model, and the
// two transcripts must be equal — what each call returned, the offsets,
// and every record and transaction marker of the partitions, read
// uncommitted. The model then cannot drift from what it stands for.

const (
	pinMaxMessageBytes = 4096
	pinBatchBytes      = 1 << 20
)

func TestKafkaModelIsKafka(t *testing.T) {
	c := kafkatest.New(t)
	topic := c.Topic(t, "pin", 2, map[string]string{"max.message.bytes": fmt.Sprint(pinMaxMessageBytes)})
	prefix := "pin-" + topic
	real, err := kafkadriver.NewKgo(func(extra []kgo.Opt) []kgo.Opt {
		return append([]kgo.Opt{
			kgo.SeedBrokers(c.Brokers...),
			kgo.RecordPartitioner(kafkatarget.Partitioner()),
			kgo.ProducerBatchMaxBytes(pinBatchBytes),
			kgo.ProducerBatchCompression(kgo.NoCompression()),
			kgo.ProducerLinger(0),
			kgo.RecordRetries(3),
		}, extra...)
	}, func(id string) []kgo.Opt {
		return []kgo.Opt{kgo.TransactionalID(id), kgo.TransactionTimeout(time.Minute), kgo.RequiredAcks(kgo.AllISRAcks())}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	// kfake registers a refused produce's partition in the transaction
	// before it checks the epoch; a real broker does not. The model plays
	// whichever it is compared with.
	model := sim.NewKafkaModel(pinMaxMessageBytes, pinBatchBytes, kafkatarget.Partitioner(), !kafkatest.Real())
	model.CreateTopic(topic, 2)

	want := kafkaScenario(t, real, topic, prefix)
	got := kafkaScenario(t, model.Driver(), topic, prefix)
	if diff := compareLines(want, got); diff != "" {
		t.Fatalf("the Kafka model differs from Kafka (kfake: %v):\n%s", !kafkatest.Real(), diff)
	}
	t.Logf("%d lines of transcript agree", len(want))
}

// kafkaScenario runs the scenario through d and returns its transcript.
func kafkaScenario(t *testing.T, d kafkadriver.Driver, topic, prefix string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []string
	say := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	pids := map[int64]string{} // producer ids, by order of appearance
	rec := func(key, value string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value), Headers: []kgo.RecordHeader{{Key: "outbox_id", Value: []byte(value)}}}
	}
	newTxn := func(name string) kafkadriver.Transactional {
		p, err := d.Transactional(prefix + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	produce := func(who string, p kafkadriver.Transactional, records ...*kgo.Record) {
		errs, finished := p.Produce(ctx, records)
		classes := make([]string, len(errs))
		for i, err := range errs {
			classes[i] = errClass(err)
		}
		say("%s produce %d: finished %v, %s", who, len(records), finished, strings.Join(classes, " "))
	}
	end := func(who string, p kafkadriver.Transactional, commit bool) {
		committed, err := p.End(ctx, commit)
		say("%s end(commit %v): committed %v, %s", who, commit, committed, errClass(err))
	}
	dump := func(label string) {
		offsets, err := d.Offsets(ctx, topic)
		if err != nil {
			t.Fatalf("%s: offsets: %v", label, err)
		}
		parts := make([]int32, 0, len(offsets))
		for p := range offsets {
			parts = append(parts, p)
		}
		slices.Sort(parts)
		for _, p := range parts {
			off := offsets[p]
			say("%s: partition %d: start %d end %d", label, p, off.Start, off.End)
			records, err := d.ReadLog(ctx, topic, p, off.Start, off.End)
			if err != nil {
				t.Fatalf("%s: read partition %d: %v", label, p, err)
			}
			for _, r := range records {
				pid, ok := pids[r.ProducerID]
				if !ok {
					pid = fmt.Sprintf("P%d", len(pids)+1)
					pids[r.ProducerID] = pid
				}
				if r.Marker {
					say("  %d: marker of %s, commit %v", r.Offset, pid, r.Commit)
					continue
				}
				say("  %d: %s=%s of %s, transactional %v", r.Offset, r.Key, r.Value, pid, r.Transactional)
			}
		}
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// A transaction committed, over both partitions.
	a := newTxn("a")
	check(a.Init(ctx))
	check(a.Begin())
	produce("a", a, rec("k1", "a1"), rec("k2", "a2"), rec("k3", "a3"), rec("k1", "a4"))
	end("a", a, true)
	dump("after a's commit")

	// Fenced: a second producer of the id; the first can no longer write
	// nor commit.
	a2 := newTxn("a")
	check(a2.Init(ctx))
	check(a.Begin())
	produce("a (fenced)", a, rec("k1", "z1"))
	end("a (fenced)", a, true)

	// An aborted transaction, records and marker.
	check(a2.Begin())
	produce("a2", a2, rec("k2", "b1"), rec("k2", "b2"))
	end("a2", a2, false)
	dump("after a2's abort")

	// A record batch larger than max.message.bytes is refused, with the
	// records of its partition after it; the transaction then commits
	// what was written (nothing).
	check(a2.Begin())
	big := rec("k3", "big")
	big.Value = make([]byte, pinMaxMessageBytes+100)
	produce("a2", a2, rec("k3", "c1"), big, rec("k3", "c2"))
	end("a2", a2, false)

	// Another producer's open transaction: the end offset moves past it,
	// and its records have no marker until it ends.
	b := newTxn("b")
	check(b.Init(ctx))
	check(b.Begin())
	produce("b", b, rec("k1", "open1"))
	check(a2.Begin())
	produce("a2", a2, rec("k1", "d1"), rec("k2", "d2"))
	end("a2", a2, true)
	dump("with b's transaction open")
	end("b", b, true)

	// A producer fenced with a transaction open: the new producer's init
	// aborts it.
	c1 := newTxn("c")
	check(c1.Init(ctx))
	check(c1.Begin())
	produce("c1", c1, rec("k2", "e1"))
	c2 := newTxn("c")
	check(c2.Init(ctx))
	end("c1 (fenced)", c1, true)
	dump("after c2's init")
	return out
}

// errClass names an error as the transcripts compare it.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.ProducerFenced):
		return "fenced"
	case errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge):
		return "too-large"
	case errors.Is(err, kerr.InvalidTxnState):
		return "invalid-txn-state"
	}
	return "error(" + err.Error() + ")"
}

// compareLines returns the first lines where want and got differ, with
// context ("" when equal).
func compareLines(want, got []string) string {
	n := max(len(want), len(got))
	for i := range n {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			var b strings.Builder
			for j := max(0, i-3); j < min(n, i+4); j++ {
				var wj, gj string
				if j < len(want) {
					wj = want[j]
				}
				if j < len(got) {
					gj = got[j]
				}
				mark := " "
				if wj != gj {
					mark = "≠"
				}
				fmt.Fprintf(&b, "%s line %d\n    real:  %s\n    model: %s\n", mark, j+1, wj, gj)
			}
			return b.String()
		}
	}
	return ""
}

package kafka_test

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/cetest"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// compactedTopic creates a one-partition topic with cleanup.policy=compact
// that drops tombstones as soon as it compacts (delete.retention.ms=0).
func compactedTopic(t *testing.T, c *kafkatest.Cluster) string {
	t.Helper()
	return c.Topic(t, "settings", 1, map[string]string{"cleanup.policy": "compact", "delete.retention.ms": "0"})
}

// byKey returns the records of rs by key (the last one of each key).
func byKey(rs []*kgo.Record) map[string]*kgo.Record {
	out := map[string]*kgo.Record{}
	for _, r := range rs {
		out[string(r.Key)] = r
	}
	return out
}

func keys(m map[string]*kgo.Record) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// A tombstone published into the outbox reaches Kafka as a record with its
// key and a null value, through a forwarder, in both delivery modes and
// both CloudEvents modes (a tombstone goes in binary mode in structured
// mode too); compaction then deletes the key. A message with an empty
// payload that is no tombstone gets an empty, non-null value and survives
// compaction: only a tombstone deletes.
func TestTombstoneDeletesItsKeyFromACompactedTopic(t *testing.T) {
	for _, tc := range []struct {
		name        string
		atLeastOnce bool
		ce          forwarder.CloudEventsMode
	}{
		{"exactly-once", false, forwarder.CloudEventsOff},
		{"at-least-once", true, forwarder.CloudEventsOff},
		{"exactly-once/cloudevents-binary", false, forwarder.CloudEventsBinary},
		{"at-least-once/cloudevents-structured", true, forwarder.CloudEventsStructured},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fwdtest.NewEnv(t)
			e.Register("settings", 1)
			c := kafkatest.New(t)
			topic := compactedTopic(t, c)
			cfg := kafka.Config{Brokers: c.Brokers, AtLeastOnce: tc.atLeastOnce}
			if tc.ce != forwarder.CloudEventsOff {
				cfg.CloudEvents = forwarder.CloudEvents{Mode: tc.ce, Source: "/test/settings"}
			}
			fwdtest.StartForwarder(t, e, nil, newTargetWith(t, cfg), []string{"settings"}, func(cfg *forwarder.Config) {
				cfg.TargetTopic = func(string) string { return topic }
			})
			pub := e.Publisher(nil)
			if err := pub.Publish("settings",
				cetest.Setting(t, "k1", "v1", false), cetest.Setting(t, "k2", "v2", false), cetest.Setting(t, "k3", "", false), cetest.Setting(t, "k1", "", true),
			); err != nil {
				t.Fatal(err)
			}
			var rs []*kgo.Record
			outboxtest.WaitFor(t, "4 records on Kafka", time.Minute, func() bool {
				rs = c.ReadCommitted(t, topic)
				return len(rs) == 4
			})
			tomb, empty := rs[3], rs[2]
			if string(tomb.Key) != "k1" || tomb.Value != nil || kafkatest.Header(tomb, outbox.MetadataTombstone) != "true" {
				t.Fatalf("tombstone record: key %q, value %#v (want nil), header %s %q", tomb.Key, tomb.Value, outbox.MetadataTombstone, kafkatest.Header(tomb, outbox.MetadataTombstone))
			}
			if string(empty.Key) != "k3" || empty.Value == nil || (len(empty.Value) != 0 && tc.ce != forwarder.CloudEventsStructured) {
				t.Fatalf("empty message: key %q, value %#v (want empty, not null)", empty.Key, empty.Value)
			}
			if tc.ce != forwarder.CloudEventsOff {
				ev := cetest.Event(t, cetest.FromKafka(tomb))
				if ev.Type() != "com.example.setting.deleted" || ev.Subject() != "k1" || len(ev.Data()) != 0 || ev.ID() != kafkatest.Header(tomb, outbox.MetadataID) {
					t.Fatalf("the tombstone's event: %s", ev)
				}
				if ct := kafkatest.Header(tomb, "content-type"); ct != "" {
					t.Fatalf("the tombstone has content-type %q: it is sent in binary mode, without data", ct)
				}
				cetest.Event(t, cetest.FromKafka(rs[0]))
			}

			// One more record, so that the tombstone is not in the last
			// batch, which compaction keeps as Kafka keeps the active
			// segment.
			if err := pub.Publish("settings", cetest.Setting(t, "k9", "v9", false)); err != nil {
				t.Fatal(err)
			}
			outboxtest.WaitFor(t, "5 records on Kafka", time.Minute, func() bool { return len(c.ReadCommitted(t, topic)) == 5 })
			if !c.Compact() {
				t.Logf("a real cluster compacts on its own schedule: the null value of the tombstone was checked, compaction was not")
				return
			}
			left := byKey(c.ReadCommitted(t, topic))
			if got := keys(left); got != "k2,k3,k9" {
				t.Fatalf("keys after compaction: %s, want k2,k3,k9 (k1 deleted by its tombstone)", got)
			}
		})
	}
}

// The target refuses a tombstone it cannot send as one, before sending
// anything of it: it rejects the message (dead letter) with a
// *outboxtype.MessageError and delivers the messages before it.
func TestKafkaTargetRejectsBadTombstones(t *testing.T) {
	valued := marshalerFunc(func(topic string, msg *message.Message) (*kgo.Record, error) {
		return &kgo.Record{Topic: topic, Value: []byte("a value")}, nil
	})
	for _, mode := range deliveryModes {
		for _, bad := range []struct {
			name string
			edit func(*message.Message)
			cfg  func(*kafka.Config)
		}{
			{"with a payload", func(m *message.Message) { m.Metadata.Set(outbox.MetadataTombstone, "true") }, nil},
			{"with another mark", func(m *message.Message) { m.Payload = nil; m.Metadata.Set(outbox.MetadataTombstone, "1") }, nil},
			{"without a key", func(m *message.Message) {
				m.Payload = nil
				_ = outbox.Tombstone(m)
				m.Metadata.Set(outbox.MetadataPartitionKey, "")
			}, nil},
			{"given a value by the Marshaler", func(m *message.Message) { m.Payload = nil; _ = outbox.Tombstone(m) }, func(c *kafka.Config) { c.Marshaler = valued }},
		} {
			t.Run(mode.name+"/"+bad.name, func(t *testing.T) {
				c := kafkatest.New(t)
				topic := c.Topic(t, "settings", 1, nil)
				cfg := kafka.Config{Brokers: c.Brokers, AtLeastOnce: mode.atLeastOnce}
				if bad.cfg != nil {
					bad.cfg(&cfg)
				}
				target := newTargetWith(t, cfg)
				batch := fwdtest.OutboxBatch(3, func(i int) string { return fmt.Sprintf("key-%d", i) })
				bad.edit(batch[1])
				done, err := target.Send(outboxtest.Ctx(t), topic, batch)
				var me *outboxtype.MessageError
				if done != 1 || !errors.Is(err, outbox.ErrPoison) || !errors.As(err, &me) || me.UUID != batch[1].UUID {
					t.Fatalf("Send: done %d, %v; want 1 and the tombstone rejected with a *MessageError", done, err)
				}
				t.Logf("%v", err)
				fwdtest.AssertPositions(t, "records", positions(kafkaLog(t, c, topic)), []int{0})
			})
		}
	}
}

// marshalerFunc adapts a function to kafka.Marshaler.
type marshalerFunc func(topic string, msg *message.Message) (*kgo.Record, error)

func (f marshalerFunc) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	return f(topic, msg)
}

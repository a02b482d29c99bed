package jetstream_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/jetstream"
	"github.com/millrace/watermill-outbox/integration/internal/cetest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// newTargetWith returns a target made of cfg (its AckTimeout 2 s), closed
// when the test ends.
func newTargetWith(t *testing.T, cfg jetstream.Config) *jetstream.Target {
	t.Helper()
	cfg.AckTimeout = 2 * time.Second
	target, err := jetstream.NewTarget(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = target.Close() })
	return target
}

// With KeySubjects, a tombstone forwarded from the outbox purges its key's
// subject: the server stores it as a rollup (Nats-Rollup "sub") and
// removes every earlier message of the subject; the other keys keep
// theirs. With CloudEvents in structured mode the tombstone still goes in
// binary mode, which the CloudEvents SDK reads as an event without data.
func TestJetStreamTombstonePurgesItsKeySubject(t *testing.T) {
	for name, ce := range map[string]forwarder.CloudEventsMode{"plain": forwarder.CloudEventsOff, "cloudevents-structured": forwarder.CloudEventsStructured} {
		t.Run(name, func(t *testing.T) {
			s := startNATS(t, -1, t.TempDir(), nil)
			e := fwdtest.NewEnv(t)
			e.Register("settings", 2)
			cfg := jetstream.Config{URL: s.ClientURL(), KeySubjects: true}
			if ce != forwarder.CloudEventsOff {
				cfg.CloudEvents = forwarder.CloudEvents{Mode: ce, Source: "/test/settings"}
			}
			target := newTargetWith(t, cfg)
			js := target.JetStream()
			stream, err := js.CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{
				Name: "settings", Subjects: []string{"settings.>"}, AllowRollup: true, Duplicates: 2 * time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			fwdtest.StartForwarder(t, e, nil, target, []string{"settings"}, nil)
			if err := e.Publisher(nil).Publish("settings",
				cetest.Setting(t, "k1", "v1", false), cetest.Setting(t, "k1", "v2", false), cetest.Setting(t, "user.k2", "v1", false), cetest.Setting(t, "k1", "", true),
			); err != nil {
				t.Fatal(err)
			}
			var info *natsjs.StreamInfo
			outboxtest.WaitFor(t, "4 messages stored", time.Minute, func() bool {
				info, err = stream.Info(outboxtest.Ctx(t), natsjs.WithSubjectFilter("settings.>"))
				return err == nil && info.State.LastSeq >= 4
			})
			if got := info.State.Subjects; info.State.Msgs != 2 || got["settings.k1"] != 1 || got["settings.user.k2"] != 1 {
				t.Fatalf("stream holds %d messages, per subject %v; want the tombstone alone on settings.k1 and user.k2's message", info.State.Msgs, got)
			}
			last, err := stream.GetLastMsgForSubject(outboxtest.Ctx(t), "settings.k1")
			if err != nil {
				t.Fatal(err)
			}
			if len(last.Data) != 0 || last.Header.Get(outbox.MetadataTombstone) != "true" || last.Header.Get("Nats-Rollup") != "sub" || last.Header.Get("KV-Operation") != "PURGE" {
				t.Fatalf("last message of settings.k1: data %q, headers %v", last.Data, last.Header)
			}
			if ce != forwarder.CloudEventsOff {
				ev := cetest.Event(t, cetest.FromNATS(last.Header, last.Data))
				if ev.Type() != "com.example.setting.deleted" || ev.Subject() != "k1" || len(ev.Data()) != 0 {
					t.Fatalf("the tombstone's event: %s", ev)
				}
			}
		})
	}
}

// A KV bucket is a stream with a subject per key: forwarded to
// "$KV.<bucket>" with KeySubjects, messages put their keys, and a
// tombstone deletes its key as the bucket's own Purge does: the key reads
// as not found (KV-Operation "PURGE"), and its history is gone, though the
// bucket keeps 5 values per key (the rollup).
func TestJetStreamTombstoneDeletesAKeyOfAKVBucket(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	e := fwdtest.NewEnv(t)
	e.Register("settings", 2)
	target := newTargetWith(t, jetstream.Config{URL: s.ClientURL(), KeySubjects: true})
	kv, err := target.JetStream().CreateKeyValue(outboxtest.Ctx(t), natsjs.KeyValueConfig{Bucket: "settings", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	fwdtest.StartForwarder(t, e, nil, target, []string{"settings"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return "$KV.settings" }
	})
	pub := e.Publisher(nil)
	if err := pub.Publish("settings", cetest.Setting(t, "k1", "v1", false), cetest.Setting(t, "k2", "v2", false)); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "k1 and k2 put", time.Minute, func() bool {
		_, err1 := kv.Get(outboxtest.Ctx(t), "k1")
		_, err2 := kv.Get(outboxtest.Ctx(t), "k2")
		return err1 == nil && err2 == nil
	})
	if err := pub.Publish("settings", cetest.Setting(t, "k1", "", true)); err != nil {
		t.Fatal(err)
	}
	outboxtest.WaitFor(t, "k1 deleted", time.Minute, func() bool {
		_, err := kv.Get(outboxtest.Ctx(t), "k1")
		return errors.Is(err, natsjs.ErrKeyNotFound)
	})
	if v, err := kv.Get(outboxtest.Ctx(t), "k2"); err != nil || string(v.Value()) != "v2" {
		t.Fatalf("k2: %v, %v", v, err)
	}
	status, err := kv.Status(outboxtest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if n := status.Values(); n != 2 { // k2's value and k1's purge marker
		t.Fatalf("bucket holds %d messages, want 2 (k1's history purged)", n)
	}
}

// Without KeySubjects every key shares the subject: a tombstone is
// published as a message with an empty body and header outbox_tombstone,
// and removes nothing (a rollup would remove the other keys' messages).
func TestJetStreamTombstoneWithoutKeySubjectsRemovesNothing(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	createStream(t, s.ClientURL(), "orders", 0)
	target := newTargetWith(t, jetstream.Config{URL: s.ClientURL()})
	batch := fwdtest.OutboxBatch(3, fwdtest.SameKey)
	batch[2].Payload = nil
	if err := outbox.Tombstone(batch[2]); err != nil {
		t.Fatal(err)
	}
	if done, err := target.Send(outboxtest.Ctx(t), "orders", batch); done != 3 || err != nil {
		t.Fatalf("Send: done %d, %v", done, err)
	}
	js := target.JetStream()
	fwdtest.AssertPositions(t, "stream", streamPositions(t, js, "orders"), []int{0, 1, 2})
	stream, err := js.Stream(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetMsg(outboxtest.Ctx(t), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(last.Data) != 0 || last.Header.Get(outbox.MetadataTombstone) != "true" || last.Header.Get("Nats-Rollup") != "" {
		t.Fatalf("tombstone: data %q, headers %v", last.Data, last.Header)
	}
}

// The target rejects what it cannot publish as asked, with a
// *outboxtype.MessageError (the server's refusal for a rollup the stream does
// not allow), and delivers the messages before it.
func TestJetStreamTargetRejectsBadTombstonesAndKeys(t *testing.T) {
	s := startNATS(t, -1, t.TempDir(), nil)
	tomb := func(m *message.Message) { m.Payload = nil; _ = outbox.Tombstone(m) }
	for _, bad := range []struct {
		name        string
		keySubjects bool
		rollup      bool
		edit        func(*message.Message)
	}{
		{"a tombstone with a payload", false, false, func(m *message.Message) { m.Metadata.Set(outbox.MetadataTombstone, "true") }},
		{"a tombstone without a key", false, false, func(m *message.Message) { tomb(m); m.Metadata.Set(outbox.MetadataPartitionKey, "") }},
		{"no key for the subject", true, true, func(m *message.Message) { m.Metadata.Set(outbox.MetadataPartitionKey, "") }},
		{"a key with a space", true, true, func(m *message.Message) { m.Metadata.Set(outbox.MetadataPartitionKey, "a b") }},
		{"a key with a wildcard", true, true, func(m *message.Message) { m.Metadata.Set(outbox.MetadataPartitionKey, "a.>") }},
		{"a key with an empty token", true, true, func(m *message.Message) { m.Metadata.Set(outbox.MetadataPartitionKey, "a..b") }},
		{"a rollup the stream does not allow", true, false, tomb},
	} {
		t.Run(bad.name, func(t *testing.T) {
			target := newTargetWith(t, jetstream.Config{URL: s.ClientURL(), KeySubjects: bad.keySubjects})
			name := "s" + strconv.FormatInt(time.Now().UnixNano(), 36)
			if _, err := target.JetStream().CreateStream(outboxtest.Ctx(t), natsjs.StreamConfig{
				Name: name, Subjects: []string{name, name + ".>"}, AllowRollup: bad.rollup,
			}); err != nil {
				t.Fatal(err)
			}
			batch := fwdtest.OutboxBatch(3, func(i int) string { return "key-" + strconv.Itoa(i) })
			bad.edit(batch[1])
			done, err := target.Send(outboxtest.Ctx(t), name, batch)
			if done != 1 || !errors.Is(err, outbox.ErrPoison) {
				t.Fatalf("Send: done %d, %v; want 1 and message 1 rejected", done, err)
			}
			var me *outboxtype.MessageError
			if bad.name != "a rollup the stream does not allow" && (!errors.As(err, &me) || me.UUID != batch[1].UUID) {
				t.Fatalf("Send: %v, want a *MessageError for message 1", err)
			}
			t.Logf("%v", err)
		})
	}
}

package jetstream

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/cloudevents"
)

// CloudEvents into JetStream (Config.CloudEvents), as the CloudEvents NATS
// protocol binding defines them:
//
//   - binary mode: the body is the event's data; each attribute is a
//     header "ce-<name>" (ce-specversion "1.0", ce-id, ce-source, ce-type,
//     ce-time, ce-subject, ce-datacontenttype), its value percent-encoded
//     (space, '"', '%' and what is not printable ASCII, as %XX of its UTF-8
//     bytes). The CloudEvents Go SDK (protocol/nats_jetstream) reads the
//     headers as they are, without decoding: values that need no encoding
//     (ids, URI sources, dotted types, RFC 3339 times, ASCII keys) read the
//     same either way;
//   - structured mode: the body is the event in the JSON event format,
//     header Content-Type "application/cloudevents+json";
//   - a tombstone goes in binary mode in both (no data; see tombstone.go).
//
// The Marshaler's headers (the metadata, the UUID, the outbox_* headers)
// stay in both modes; those a receiver would read as part of the event
// (ce-…, content-type, in any case) are refused in metadata and dropped
// when a custom Marshaler writes them.

// headerPrefix starts the header of each attribute in binary mode.
const headerPrefix = "ce-"

// cloudEvent makes nm, the message of msg with key (tomb: a tombstone),
// the event of msg in cfg's mode.
func cloudEvent(cfg forwarder.CloudEvents, nm *nats.Msg, msg *message.Message, key string, tomb bool) error {
	if err := cloudevents.CheckMetadata(cfg, msg, headerPrefix); err != nil {
		return err
	}
	ev, err := cloudevents.Of(cfg, msg, key, time.Now())
	if err != nil {
		return err
	}
	for k := range nm.Header {
		if cloudevents.Reserved(k, headerPrefix) {
			delete(nm.Header, k)
		}
	}
	if cfg.Mode == forwarder.CloudEventsStructured && !tomb {
		body, err := cloudevents.Structured(ev, nm.Data)
		if err != nil {
			return fmt.Errorf("CloudEvents JSON of message %s: %w", msg.UUID, err)
		}
		nm.Data = body
		nm.Header.Set("Content-Type", cloudevents.StructuredMediaType)
		return nil
	}
	for _, a := range ev.Attributes() {
		nm.Header.Set(headerPrefix+a.Name, cloudevents.PercentEncode(a.Value))
	}
	return nil
}

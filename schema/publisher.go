package schema

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/sr"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/errs"
)

// Metadata the Publisher sets on each message of a topic with a schema.
// They travel with the message (Kafka headers, NATS headers), and tell the
// Publisher that a payload is in the wire format already.
const (
	// MetadataSchemaID is the schema id the payload was validated against
	// (also in the payload's header).
	MetadataSchemaID = "schema_id"
	// MetadataSubject is the schema's registry subject.
	MetadataSubject = "schema_subject"
	// MetadataVersion is the subject's version of the schema.
	MetadataVersion = "schema_version"
	// MetadataCloudEventsDataSchema is read by the forwarder's CloudEvents
	// as the dataschema attribute (set with Config.CloudEventsMetadata):
	// the registry's URL of the schema, <registry>/schemas/ids/<id>.
	MetadataCloudEventsDataSchema = "ce_dataschema"
	// MetadataCloudEventsContentType is read by the forwarder's
	// CloudEvents as the datacontenttype attribute (set with
	// Config.CloudEventsMetadata): Format.ContentType.
	MetadataCloudEventsContentType = "ce_datacontenttype"
)

// Publisher validates and encodes the messages of the topics that have a
// schema, then publishes them with the Publisher it wraps: with an outbox
// Publisher, in the caller's transaction, so that the business change
// cannot commit with an event its consumers cannot read. Messages of other
// topics pass as they are. Create it with Codec.Publisher.
type Publisher struct {
	codec *Codec
	next  message.Publisher
}

// Publisher returns a Publisher that validates for c and publishes with
// next (an *outbox.Publisher, or any message.Publisher).
//
// Each message of a topic with a schema is, before anything is published:
//   - a tombstone (outbox.Tombstone, no payload): passed as it is;
//   - in the wire format with metadata MetadataSchemaID (made by
//     Codec.NewMessage, or published before): its header's id must be the
//     metadata's and a version of the topic's subject (an id not seen
//     before is looked up in the registry once), and its record must
//     match that version;
//   - else its payload is the record itself (Avro binary, protobuf binary,
//     JSON text): it must match the topic's schema, and is replaced by its
//     wire format.
//
// A message that fails makes the whole call fail with a *SchemaError
// (ErrMismatch; or a *RegistryError when an unseen id cannot be looked
// up): nothing of the call is published, no message is changed. Else each
// message's payload is its wire format and the metadata MetadataSchemaID,
// MetadataSubject and MetadataVersion are set (and the CloudEvents ones,
// with Config.CloudEventsMetadata) before next publishes them.
func (c *Codec) Publisher(next message.Publisher) (*Publisher, error) {
	if c == nil || c.topics == nil {
		return nil, errs.NotConstructed("schema.Codec", "schema.New")
	}
	if next == nil {
		return nil, errs.NilArgument("schema.Codec.Publisher: next", "pass the Publisher to publish with (an *outbox.Publisher)")
	}
	return &Publisher{codec: c, next: next}, nil
}

// Publish validates and encodes msgs (see Codec.Publisher) and publishes
// them to topic with the wrapped Publisher.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if p == nil || p.codec == nil {
		return errs.NotConstructed("schema.Publisher", "schema.Codec.Publisher")
	}
	t := p.codec.topics[topic]
	if t == nil {
		return p.next.Publish(topic, msgs...)
	}
	payloads := make([][]byte, len(msgs))
	ids := make([]int, len(msgs))
	for i, m := range msgs {
		if m == nil {
			continue // the wrapped Publisher refuses it, typed
		}
		payload, id, err := p.codec.check(t, m)
		if err != nil {
			return err
		}
		payloads[i], ids[i] = payload, id
	}
	for i, m := range msgs {
		if m == nil || payloads[i] == nil {
			continue
		}
		m.Payload = payloads[i]
		p.codec.mark(t, m, ids[i])
	}
	return p.next.Publish(topic, msgs...)
}

// Close closes the wrapped Publisher.
func (p *Publisher) Close() error {
	if p == nil || p.next == nil {
		return errs.NotConstructed("schema.Publisher", "schema.Codec.Publisher")
	}
	return p.next.Close()
}

// check validates m for topic t and returns its payload in the wire
// format and the schema id it was validated against; a nil payload for a
// tombstone, which passes as it is.
func (c *Codec) check(t *topicSchema, m *message.Message) ([]byte, int, error) {
	if len(m.Payload) == 0 && outbox.IsTombstone(m) {
		return nil, 0, nil
	}
	if md := m.Metadata.Get(MetadataSchemaID); md != "" {
		id, err := c.checkWire(t, m, md)
		return m.Payload, id, err
	}
	if err := t.codec.validate(m.Payload); err != nil {
		return nil, 0, &SchemaError{Topic: t.topic, Subject: t.subject, Version: t.version, ID: t.id, UUID: m.UUID, Kind: ErrMismatch,
			Reason: "the payload does not match the topic's schema (fix the producer, or register the new schema)", Err: err}
	}
	out := make([]byte, 0, len(t.header)+len(m.Payload))
	return append(append(out, t.header...), m.Payload...), t.id, nil
}

// checkWire validates a payload that says it is in the wire format and
// returns the schema id of its header.
func (c *Codec) checkWire(t *topicSchema, m *message.Message, md string) (int, error) {
	mismatch := func(version, id int, reason string, err error) error {
		return &SchemaError{Topic: t.topic, Subject: t.subject, Version: version, ID: id, UUID: m.UUID, Kind: ErrMismatch, Reason: reason, Err: err}
	}
	id, body, err := (&sr.ConfluentHeader{}).DecodeID(m.Payload)
	if err != nil {
		return 0, mismatch(t.version, t.id, fmt.Sprintf("metadata %s is %q but the payload is not in the wire format (magic byte 0, schema id): publish the record itself without that metadata, or make the message with Codec.NewMessage", MetadataSchemaID, md), err)
	}
	if md != strconv.Itoa(id) {
		return 0, mismatch(t.version, id, fmt.Sprintf("metadata %s is %q but the payload's header says %d", MetadataSchemaID, md, id), nil)
	}
	if id == t.id && bytes.HasPrefix(m.Payload, t.header) {
		if err := t.codec.validate(m.Payload[len(t.header):]); err != nil {
			return 0, mismatch(t.version, id, "the record does not match the schema of its id", err)
		}
		return id, nil
	}
	ctx, cancel := context.WithTimeout(m.Context(), c.cfg.Timeout)
	defer cancel()
	version, err := c.versionOf(ctx, t, id)
	if err != nil {
		return 0, err
	}
	codec, body, err := c.codecOf(ctx, id, body)
	if err != nil {
		return 0, err
	}
	if err := codec.validate(body); err != nil {
		return 0, mismatch(version, id, "the record does not match the schema of its id", err)
	}
	return id, nil
}

// mark sets the schema's metadata on m.
func (c *Codec) mark(t *topicSchema, m *message.Message, id int) {
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
	m.Metadata.Set(MetadataSubject, t.subject)
	if id == t.id {
		m.Metadata.Set(MetadataSchemaID, t.idText)
		m.Metadata.Set(MetadataVersion, t.verText)
	} else {
		m.Metadata.Set(MetadataSchemaID, strconv.Itoa(id))
		if v, ok := c.knownVersion(t, id); ok {
			m.Metadata.Set(MetadataVersion, strconv.Itoa(v))
		}
	}
	if c.cfg.CloudEventsMetadata {
		if len(c.urls) > 0 {
			m.Metadata.Set(MetadataCloudEventsDataSchema, fmt.Sprintf("%s/schemas/ids/%d", c.urls[0], id))
		}
		m.Metadata.Set(MetadataCloudEventsContentType, t.format.ContentType())
	}
}

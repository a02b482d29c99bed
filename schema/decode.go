package schema

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/internal/errs"
)

// maxIndexes bounds the Protobuf message indexes read from a header.
const maxIndexes = 64

// NewMessage encodes v with topic's schema into a message in the wire
// format, with a new UUID and the metadata MetadataSchemaID,
// MetadataSubject and MetadataVersion: publish it with the Codec's
// Publisher. v is, for Avro, a value github.com/hamba/avro/v2 encodes with
// the schema (a struct with `avro` tags, a map[string]any); for Protobuf,
// a proto.Message of the schema's message; for JSON Schema, a value
// encoding/json encodes. A value that does not fit is a *SchemaError
// (ErrMismatch); a topic without a schema one too (ErrNotRegistered).
func (c *Codec) NewMessage(topic string, v any) (*message.Message, error) {
	if c == nil || c.topics == nil {
		return nil, errs.NotConstructed("schema.Codec", "schema.New")
	}
	t := c.topics[topic]
	if t == nil {
		return nil, &SchemaError{Topic: topic, Kind: ErrNotRegistered, Reason: "the Codec has no schema for this topic: add it to Config.Schemas"}
	}
	if v == nil {
		return nil, errs.NilArgument("schema.Codec.NewMessage: v", "pass the value to encode")
	}
	payload, err := t.codec.encode(append(make([]byte, 0, len(t.header)+256), t.header...), v)
	if err != nil {
		return nil, &SchemaError{Topic: topic, Subject: t.subject, Version: t.version, ID: t.id, Kind: ErrMismatch, Reason: "the value does not fit the topic's schema", Err: err}
	}
	m := message.NewMessage(watermill.NewUUID(), payload)
	c.mark(t, m, t.id)
	return m, nil
}

// Decode decodes a message in the wire format (a delivery of a topic with
// a schema, in a Subscriber's or an inbox's handler) into v, a pointer: for
// Avro a value github.com/hamba/avro/v2 decodes into (a struct with `avro`
// tags, *map[string]any, *any); for Protobuf a proto.Message of the
// record's message; for JSON Schema a value encoding/json decodes into.
// The record's schema is looked up by the id in its header (in the
// registry once per id, then from the Codec's cache), so a Codec made with
// no Schemas decodes any topic. Errors: a payload that is not in the wire
// format, or does not decode into v, is a *SchemaError (ErrMismatch); an id
// the registry does not know is one too (ErrNotRegistered); a registry that
// cannot be reached for an id not seen before is a *RegistryError.
func (c *Codec) Decode(msg *message.Message, v any) error {
	if c == nil || c.byID == nil {
		return errs.NotConstructed("schema.Codec", "schema.New")
	}
	if msg == nil {
		return errs.NilArgument("schema.Codec.Decode: msg", "pass the delivered message")
	}
	if v == nil {
		return errs.NilArgument("schema.Codec.Decode: v", "pass a pointer to the value to decode into")
	}
	ctx, cancel := context.WithTimeout(msg.Context(), c.cfg.Timeout)
	defer cancel()
	id, body, err := (&sr.ConfluentHeader{}).DecodeID(msg.Payload)
	if err != nil {
		return &SchemaError{UUID: msg.UUID, Kind: ErrMismatch, Reason: "the payload is not in the schema registry's wire format (magic byte 0, schema id)", Err: err}
	}
	codec, body, err := c.codecOf(ctx, id, body)
	if err != nil {
		return err
	}
	if err := codec.decode(body, v); err != nil {
		return &SchemaError{ID: id, UUID: msg.UUID, Kind: ErrMismatch, Reason: "the record does not decode into the value", Err: err}
	}
	return nil
}

// JSON renders a payload in the wire format as JSON text, decoded with the
// schema of its id (looked up in the registry once per id). ok is false,
// with a nil error, for a payload that is not in the wire format (it is
// shown as it is). For the CLI and the console.
func (c *Codec) JSON(ctx context.Context, payload []byte) (text []byte, id int, ok bool, err error) {
	if c == nil || c.byID == nil {
		return nil, 0, false, errs.NotConstructed("schema.Codec", "schema.New")
	}
	if ctx == nil {
		return nil, 0, false, errs.NilArgument("schema.Codec.JSON: ctx", "pass a context")
	}
	id, body, err := (&sr.ConfluentHeader{}).DecodeID(payload)
	if err != nil {
		return nil, 0, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	codec, body, err := c.codecOf(ctx, id, body)
	if err != nil {
		return nil, id, false, err
	}
	text, err = codec.json(body)
	if err != nil {
		return nil, id, false, &SchemaError{ID: id, Kind: ErrMismatch, Reason: "the record does not decode with the schema of its id", Err: err}
	}
	return text, id, true, nil
}

// codecOf returns the compiled schema of id (for Protobuf, of the message
// the indexes at the start of body name) and the record after the header.
func (c *Codec) codecOf(ctx context.Context, id int, body []byte) (codecFor, []byte, error) {
	s, err := c.schemaByID(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	var index []int
	if s.format == Protobuf {
		index, body, err = (&sr.ConfluentHeader{}).DecodeIndex(body, maxIndexes)
		if err != nil {
			return nil, nil, &SchemaError{ID: id, Kind: ErrMismatch, Reason: "the payload's Protobuf message indexes do not decode", Err: err}
		}
		if len(index) == 0 {
			index = []int{0}
		}
	}
	key := indexKey(index)
	s.mu.Lock()
	defer s.mu.Unlock()
	if codec := s.codecs[key]; codec != nil {
		return codec, body, nil
	}
	codec, err := compile(s.format, s.text, "", index)
	if err != nil {
		return nil, nil, &SchemaError{ID: id, Kind: ErrInvalidSchema, Reason: "the registry's schema of this id does not compile here", Err: err}
	}
	s.codecs[key] = codec
	return codec, body, nil
}

// schemaByID returns the schema of id, from the cache or the registry.
func (c *Codec) schemaByID(ctx context.Context, id int) (*idSchema, error) {
	c.mu.Lock()
	s := c.byID[id]
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	got, err := c.cfg.Client.SchemaByID(ctx, id)
	if err != nil {
		if isCode(err, sr.ErrSchemaNotFound, sr.ErrSubjectNotFound) {
			return nil, &SchemaError{ID: id, Kind: ErrNotRegistered, Reason: fmt.Sprintf("the registry at %v does not know this schema id: was the record written against another registry?", c.urls), Err: err}
		}
		return nil, c.registryError("", "", "look up schema id "+strconv.Itoa(id), err)
	}
	format, ok := formatOf(got.Type)
	if !ok {
		return nil, &SchemaError{ID: id, Kind: ErrInvalidSchema, Reason: fmt.Sprintf("the registry's schema of this id has type %v, which the Codec does not read", got.Type)}
	}
	if len(got.References) > 0 {
		return nil, &SchemaError{ID: id, Kind: ErrInvalidSchema, Reason: "the registry's schema of this id references other schemas, which the Codec does not resolve"}
	}
	s = &idSchema{id: id, format: format, text: got.Schema, codecs: map[string]codecFor{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	if known := c.byID[id]; known != nil {
		return known, nil
	}
	c.byID[id] = s
	return s, nil
}

// versionOf returns the version of t's subject whose schema is id, asking
// the registry once per id; an id of another subject is a *SchemaError.
func (c *Codec) versionOf(ctx context.Context, t *topicSchema, id int) (int, error) {
	if v, ok := c.knownVersion(t, id); ok {
		return v, nil
	}
	versions, err := c.cfg.Client.SchemaVersionsByID(ctx, id)
	if err != nil {
		if isCode(err, sr.ErrSchemaNotFound, sr.ErrSubjectNotFound) {
			return 0, &SchemaError{Topic: t.topic, Subject: t.subject, ID: id, Kind: ErrNotRegistered, Reason: "the registry does not know the payload's schema id", Err: err}
		}
		return 0, c.registryError(t.topic, t.subject, "look up schema id "+strconv.Itoa(id), err)
	}
	for _, v := range versions {
		if v.Subject == t.subject {
			c.mu.Lock()
			c.versions[versionKey{t.subject, id}] = v.Version
			c.mu.Unlock()
			return v.Version, nil
		}
	}
	return 0, &SchemaError{Topic: t.topic, Subject: t.subject, ID: id, Kind: ErrMismatch, Reason: "the payload's schema id is no version of the topic's subject: it was encoded for another topic"}
}

// versionKey keys the versions of ids the Codec has looked up.
type versionKey struct {
	subject string
	id      int
}

// knownVersion returns the version of t's subject for id when known.
func (c *Codec) knownVersion(t *topicSchema, id int) (int, bool) {
	if id == t.id {
		return t.version, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.versions[versionKey{t.subject, id}]
	return v, ok
}

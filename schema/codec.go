package schema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/internal/errs"
)

// Codec validates, encodes and decodes the records of the topics that have
// a schema, in the Confluent wire format (magic byte 0, the 4-byte schema
// id, for Protobuf the message indexes, then the record). New registers or
// looks up each topic's schema once; after that the Codec asks the
// registry only for a schema id it has not seen (a record written with
// another version, read by Decode or JSON), once per id: never a request
// per message.
//
// A Codec is safe for concurrent use.
type Codec struct {
	cfg    Config
	urls   []string
	logger watermill.LoggerAdapter
	topics map[string]*topicSchema // immutable after New

	mu       sync.Mutex
	byID     map[int]*idSchema  // schemas by id, the topics' and those fetched
	versions map[versionKey]int // versions of ids of the topics' subjects
}

// topicSchema is a topic's schema as registered.
type topicSchema struct {
	topic   string
	subject string
	version int
	id      int
	format  Format
	codec   codecFor
	header  []byte // the wire format's header: magic byte, id, indexes
	idText  string // id in decimal, for metadata
	verText string // version in decimal, for metadata
}

// idSchema is a schema known by id: its format and compiled form. Protobuf
// schemas compile per message index (codecs); the others once.
type idSchema struct {
	id     int
	format Format
	text   string
	mu     sync.Mutex
	codecs map[string]codecFor // by fmt.Sprint(index); "" for Avro and JSON
}

// New checks cfg, compiles each topic's schema, and registers it under its
// subject (Register) or looks it up (RequireRegistered), so that a schema
// the registry refuses stops the service at start, not at its first
// Publish. Errors: an *outboxtype.ConfigError for cfg; a *SchemaError for a
// schema that does not parse (ErrInvalidSchema), is incompatible with its
// subject's earlier versions (ErrIncompatible, Details name the fields) or
// is not registered (ErrNotRegistered); a *RegistryError when the
// registry cannot be reached (ErrRegistryUnavailable). A nil logger logs
// nothing.
func New(ctx context.Context, cfg Config, logger watermill.LoggerAdapter) (*Codec, error) {
	if ctx == nil {
		return nil, errs.NilArgument("schema.New: ctx", "pass a context (context.Background())")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	urls, _ := cfg.Client.OptValue(sr.URLs).([]string)
	c := &Codec{cfg: cfg, urls: urls, logger: logger, topics: map[string]*topicSchema{}, byID: map[int]*idSchema{}, versions: map[versionKey]int{}}
	for _, ts := range cfg.Schemas {
		t, err := c.start(ctx, ts)
		if err != nil {
			return nil, err
		}
		c.topics[ts.Topic] = t
		c.byID[t.id] = &idSchema{id: t.id, format: t.format, text: ts.Text, codecs: map[string]codecFor{indexKey(t.codec.index()): t.codec}}
		logger.Info("Schema ready", watermill.LogFields{"topic": t.topic, "subject": t.subject, "version": t.version, "schema_id": t.id, "format": t.format.String()})
	}
	return c, nil
}

// start compiles, registers or looks up one topic's schema.
func (c *Codec) start(ctx context.Context, ts TopicSchema) (*topicSchema, error) {
	codec, err := compile(ts.Format, ts.Text, ts.Message, nil)
	if err != nil {
		return nil, &SchemaError{Topic: ts.Topic, Kind: ErrInvalidSchema, Reason: fmt.Sprintf("the %v schema does not parse: fix its text", ts.Format), Err: err}
	}
	if c.cfg.Subjects != TopicName && codec.record() == "" {
		return nil, &SchemaError{Topic: ts.Topic, Kind: ErrInvalidSchema, Reason: fmt.Sprintf("the %v strategy names subjects by the record's full name, and this schema has none: give an Avro record a name, a JSON Schema a \"title\"", c.cfg.Subjects)}
	}
	subject := c.cfg.Subjects.Subject(ts.Topic, codec.record())
	s := sr.Schema{Schema: ts.Text, Type: ts.Format.srType()}
	fail := func(op string, err error) error { return c.registryError(ts.Topic, subject, op, err) }

	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	found, err := c.cfg.Client.LookupSchema(rctx, subject, s)
	switch {
	case err == nil:
	case isCode(err, sr.ErrSubjectNotFound, sr.ErrSchemaNotFound) && c.cfg.Registration == RequireRegistered:
		return nil, &SchemaError{Topic: ts.Topic, Subject: subject, Kind: ErrNotRegistered,
			Reason: "RequireRegistered is set and this schema is not registered under the subject: register it (your schema pipeline, or Registration: Register), or correct the schema text to the registered one", Err: err}
	case isCode(err, sr.ErrSubjectNotFound, sr.ErrSchemaNotFound):
		if found, err = c.register(rctx, ts.Topic, subject, s); err != nil {
			return nil, err
		}
	default:
		return nil, fail("look up subject "+subject, err)
	}
	t := &topicSchema{topic: ts.Topic, subject: subject, version: found.Version, id: found.ID, format: ts.Format, codec: codec}
	t.header, err = (&sr.ConfluentHeader{}).AppendEncode(nil, t.id, codec.index())
	if err != nil {
		return nil, &SchemaError{Topic: ts.Topic, Subject: subject, ID: t.id, Kind: ErrInvalidSchema, Reason: "cannot build the wire format's header", Err: err}
	}
	t.idText, t.verText = fmt.Sprint(t.id), fmt.Sprint(t.version)
	return t, nil
}

// register checks the schema's compatibility (for the registry's reasons,
// which registration alone does not give) and registers it.
func (c *Codec) register(ctx context.Context, topic, subject string, s sr.Schema) (sr.SubjectSchema, error) {
	check, err := c.cfg.Client.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), subject, -1, s)
	switch {
	case err == nil && !check.Is:
		return sr.SubjectSchema{}, &SchemaError{Topic: topic, Subject: subject, Kind: ErrIncompatible, Details: check.Messages,
			Reason: "the registry refuses it under the subject's compatibility level: change the schema compatibly (e.g. give a new field a default), or change the subject's compatibility level"}
	case err == nil, isCode(err, sr.ErrSubjectNotFound, sr.ErrVersionNotFound):
	default:
		return sr.SubjectSchema{}, c.registryError(topic, subject, "check compatibility of subject "+subject, err)
	}
	if _, err := c.cfg.Client.RegisterSchema(ctx, subject, s, -1, -1); err != nil {
		return sr.SubjectSchema{}, c.registryError(topic, subject, "register subject "+subject, err)
	}
	found, err := c.cfg.Client.LookupSchema(ctx, subject, s)
	if err != nil {
		return sr.SubjectSchema{}, c.registryError(topic, subject, "look up subject "+subject, err)
	}
	return found, nil
}

// registryError turns a client error into the package's: a refusal of the
// registry into a *SchemaError, anything else into a *RegistryError.
func (c *Codec) registryError(topic, subject, op string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode < 500 {
		kind := ErrNotRegistered
		reason := "the registry refused: " + re.Message
		switch {
		case re.StatusCode == 409 || re.ErrorCode == sr.ErrIncompatibleSchema.Code:
			kind = ErrIncompatible
			reason = "the registry refuses it under the subject's compatibility level: change the schema compatibly, or the subject's compatibility level"
			return &SchemaError{Topic: topic, Subject: subject, Kind: kind, Reason: reason, Details: []string{re.Message}, Err: err}
		case re.ErrorCode == sr.ErrInvalidSchema.Code || re.StatusCode == 422:
			kind = ErrInvalidSchema
		}
		return &SchemaError{Topic: topic, Subject: subject, Kind: kind, Reason: reason, Err: err}
	}
	return &RegistryError{Op: op, URLs: c.urls, Err: err}
}

// isCode reports a registry answer with one of the error codes.
func isCode(err error, codes ...*sr.Error) bool {
	var re *sr.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	for _, code := range codes {
		if re.ErrorCode == code.Code {
			return true
		}
	}
	return false
}

func indexKey(index []int) string {
	if index == nil {
		return ""
	}
	return fmt.Sprint(index)
}

// Topics returns the topics the Codec has a schema for.
func (c *Codec) Topics() []string {
	if c == nil || c.topics == nil {
		return nil
	}
	out := make([]string, 0, len(c.topics))
	for t := range c.topics {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

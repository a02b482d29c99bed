package schema

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/outboxtype"
)

// Format is the serialisation format of a schema.
type Format int

// The formats, with their registry schema types.
const (
	// Avro: the schema is an Avro schema in JSON (.avsc), the records Avro
	// binary. Go values are encoded with github.com/hamba/avro/v2 (struct
	// fields by their `avro` tags).
	Avro Format = iota + 1
	// Protobuf: the schema is a .proto file, the records protobuf binary
	// preceded by the Confluent message indexes. Go values are
	// proto.Message values of the schema's message.
	Protobuf
	// JSONSchema: the schema is a JSON Schema, the records JSON text. Go
	// values are encoded with encoding/json.
	JSONSchema
)

// String names the format as the registry does (AVRO, PROTOBUF, JSON).
func (f Format) String() string {
	switch f {
	case Avro:
		return "AVRO"
	case Protobuf:
		return "PROTOBUF"
	case JSONSchema:
		return "JSON"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// ContentType is the media type of the format's records in the wire
// format, for a CloudEvent's datacontenttype.
func (f Format) ContentType() string {
	switch f {
	case Avro:
		return "application/avro"
	case Protobuf:
		return "application/x-protobuf"
	case JSONSchema:
		return "application/json"
	}
	return ""
}

func (f Format) srType() sr.SchemaType {
	switch f {
	case Protobuf:
		return sr.TypeProtobuf
	case JSONSchema:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}

func formatOf(t sr.SchemaType) (Format, bool) {
	switch t {
	case sr.TypeAvro:
		return Avro, true
	case sr.TypeProtobuf:
		return Protobuf, true
	case sr.TypeJSON:
		return JSONSchema, true
	}
	return 0, false
}

// SubjectStrategy names the registry subject of a topic's values, as
// Confluent's serializers do.
type SubjectStrategy int

// The strategies.
const (
	// TopicName (the default): "<topic>-value". One schema per topic.
	TopicName SubjectStrategy = iota
	// RecordName: the record's full name ("shop.OrderPlaced"): the Avro
	// record's namespace and name, the Protobuf message's full name, the
	// JSON Schema's "title". One schema per record type, on any topic.
	RecordName
	// TopicRecordName: "<topic>-<record full name>".
	TopicRecordName
)

// String names the strategy.
func (s SubjectStrategy) String() string {
	switch s {
	case TopicName:
		return "TopicName"
	case RecordName:
		return "RecordName"
	case TopicRecordName:
		return "TopicRecordName"
	}
	return fmt.Sprintf("SubjectStrategy(%d)", int(s))
}

// Subject returns the subject of topic's values whose record full name is
// record under the strategy.
func (s SubjectStrategy) Subject(topic, record string) string {
	switch s {
	case RecordName:
		return record
	case TopicRecordName:
		return topic + "-" + record
	}
	return topic + "-value"
}

// Registration says what New does with each schema at start.
type Registration int

// The registrations.
const (
	// Register (the default): register the schema under its subject (the
	// registry returns the existing id when it is already there, and
	// refuses it when it is incompatible with the subject's earlier
	// versions: ErrIncompatible).
	Register Registration = iota
	// RequireRegistered: look the schema up and fail (ErrNotRegistered)
	// when it is not registered under its subject: for teams whose
	// schemas are registered by a pipeline of their own, never by
	// services.
	RequireRegistered
)

// TopicSchema is the schema of one outbox topic's values.
type TopicSchema struct {
	// Topic is the outbox topic (the Kafka topic it is forwarded to).
	Topic string
	// Format is the schema's format.
	Format Format
	// Text is the schema: Avro JSON, a .proto file, a JSON Schema.
	Text string
	// Message is, for Protobuf, the full name of the message of Text the
	// topic's records are ("shop.OrderPlaced"). Default: Text's first
	// message.
	Message string
}

// Defaults of Config.
const (
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 10 * time.Second
)

// Config configures a Codec.
type Config struct {
	// Client is the registry client (franz-go's sr.NewClient(sr.URLs(…))).
	// Required.
	Client *sr.Client
	// Schemas are the schemas of the topics whose messages are validated
	// and encoded. Topics not listed are published as they are. May be
	// empty for a Codec that only decodes (Decode, JSON).
	Schemas []TopicSchema
	// Subjects is the subject naming strategy. Default TopicName.
	Subjects SubjectStrategy
	// Registration says whether New registers the schemas or requires
	// them registered. Default Register.
	Registration Registration
	// Timeout bounds each registry request (New's, and a lookup of a
	// schema id not seen before). Default DefaultTimeout.
	Timeout time.Duration
	// CloudEventsMetadata makes the Publisher set the metadata the
	// forwarder's CloudEvents read as the dataschema and datacontenttype
	// attributes (ce_dataschema, ce_datacontenttype). Leave it off when
	// the target does not send CloudEvents: the keys would be plain
	// headers.
	CloudEventsMetadata bool
}

func (c *Config) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
}

// Validate reports the first impossible setting as an
// *outboxtype.ConfigError (outbox.ErrInvalidConfig).
func (c Config) Validate() error {
	if c.Client == nil {
		return &outboxtype.ConfigError{Field: "schema.Config.Client", Reason: "is nil: create one with sr.NewClient(sr.URLs(\"http://registry:8081\"))"}
	}
	switch c.Subjects {
	case TopicName, RecordName, TopicRecordName:
	default:
		return &outboxtype.ConfigError{Field: "schema.Config.Subjects", Reason: fmt.Sprintf("%d is no strategy: TopicName, RecordName or TopicRecordName", int(c.Subjects))}
	}
	switch c.Registration {
	case Register, RequireRegistered:
	default:
		return &outboxtype.ConfigError{Field: "schema.Config.Registration", Reason: fmt.Sprintf("%d is no registration: Register or RequireRegistered", int(c.Registration))}
	}
	if c.Timeout < 0 {
		return &outboxtype.ConfigError{Field: "schema.Config.Timeout", Reason: fmt.Sprintf("%v is negative: 0 means DefaultTimeout (%v)", c.Timeout, DefaultTimeout)}
	}
	seen := map[string]bool{}
	for i, s := range c.Schemas {
		field := fmt.Sprintf("schema.Config.Schemas[%d]", i)
		switch {
		case s.Topic == "":
			return &outboxtype.ConfigError{Field: field + ".Topic", Reason: "is empty: name the outbox topic whose values have this schema"}
		case seen[s.Topic]:
			return &outboxtype.ConfigError{Field: field + ".Topic", Reason: fmt.Sprintf("%q has a schema already: one schema per topic", s.Topic)}
		case s.Format < Avro || s.Format > JSONSchema:
			return &outboxtype.ConfigError{Field: field + ".Format", Reason: fmt.Sprintf("%d is no format: Avro, Protobuf or JSONSchema", int(s.Format))}
		case s.Text == "":
			return &outboxtype.ConfigError{Field: field + ".Text", Reason: "is empty: give the schema's text (.avsc, .proto or JSON Schema)"}
		case s.Message != "" && s.Format != Protobuf:
			return &outboxtype.ConfigError{Field: field + ".Message", Reason: "is for Protobuf schemas only"}
		}
		seen[s.Topic] = true
	}
	return nil
}

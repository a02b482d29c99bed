package forwarder

import (
	"fmt"
	"mime"
	"net/url"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// CloudEventsMode says whether, and in which content mode of the
// CloudEvents protocol bindings, a target sends messages as CloudEvents.
type CloudEventsMode int

// The content modes of CloudEvents.Mode.
const (
	// CloudEventsOff (the zero value): messages are sent as they are.
	CloudEventsOff CloudEventsMode = iota
	// CloudEventsBinary: the payload is the event's data, the attributes
	// are headers (Kafka "ce_id", "content-type"…; NATS "ce-id",
	// "ce-datacontenttype"…) next to the message's metadata headers.
	CloudEventsBinary
	// CloudEventsStructured: the body is the event in the JSON event
	// format (attributes and data), with header content-type
	// "application/cloudevents+json"; the metadata headers stay.
	CloudEventsStructured
)

// Defaults of CloudEvents.
const (
	// DefaultCloudEventsTypeMetadata is the metadata key an event's type is
	// read from when CloudEvents.Type is nil.
	DefaultCloudEventsTypeMetadata = "ce_type"
	// DefaultCloudEventsTimeMetadata is the metadata key an event's time is
	// read from (RFC 3339) when the message has it.
	DefaultCloudEventsTimeMetadata = "ce_time"
)

// Metadata keys of attributes a publisher may set per message (the schema
// package's Publisher sets both with schema.Config.CloudEventsMetadata).
// Unlike other keys a binding would read as an attribute, a message may
// carry them; their attribute's header takes the place of theirs.
const (
	// DataSchemaMetadata is the metadata key of an event's dataschema
	// attribute: an absolute URI (RFC 3986, section 4.3) of the schema the
	// data adheres to, e.g. a schema registry's
	// https://registry:8081/schemas/ids/7. A value that is no absolute URI
	// rejects the message.
	DataSchemaMetadata = "ce_dataschema"
	// DataContentTypeMetadata is the metadata key of an event's
	// datacontenttype attribute, a media type ("application/avro"): it
	// takes the place of CloudEvents.DataContentType for that message. A
	// value that is no media type rejects the message.
	DataContentTypeMetadata = "ce_datacontenttype"
)

// CloudEvents makes a target (kafka.Config.CloudEvents,
// jetstream.Config.CloudEvents) send each message as a CloudEvent 1.0 of
// the broker's protocol binding (Kafka, NATS), readable by the CloudEvents
// SDKs. The zero value sends messages as they are. The attributes:
//
//   - id: the stable outbox id (outbox.MetadataID, "topic/partition/seq";
//     "<source>:<id>" from a forwarder with a Source; the UUID of a message
//     that is no outbox delivery): the same on every copy, so that
//     consumers drop copies by (source, id);
//   - source: Source;
//   - type: Type(msg), or the message's metadata TypeMetadata;
//   - time: the message's metadata TimeMetadata (RFC 3339) when the
//     publisher set it, else the time the target builds the event;
//   - subject: the message's key (the Kafka record key, the partition key
//     on NATS), left out when it has none;
//   - datacontenttype: the message's metadata DataContentTypeMetadata,
//     else DataContentType; left out when both are empty;
//   - dataschema: the message's metadata DataSchemaMetadata, left out
//     when it has none;
//   - data: the payload.
//
// A message the target cannot make an event of is rejected (outbox.Reject)
// with a *outboxtype.MessageError: no type, a TimeMetadata that is no RFC
// 3339 time, a DataSchemaMetadata that is no absolute URI, a
// DataContentTypeMetadata that is no media type, or metadata the binding
// would read as an attribute (a key starting with the binding's header
// prefix, "ce_" on Kafka and "ce-" on NATS, other than TypeMetadata,
// TimeMetadata, DataSchemaMetadata and DataContentTypeMetadata, or
// "content-type"). The outbox
// metadata (outbox_id, outbox_incarnation, outbox_source…) stay headers in
// both modes: the Kafka target's exactly-once tail read finds its records
// by them. A tombstone (outbox.Tombstone) is sent in binary mode in both
// modes: the bindings define no structured tombstone (docs/forwarder.md,
// "CloudEvents").
type CloudEvents struct {
	// Mode is CloudEventsBinary or CloudEventsStructured; CloudEventsOff
	// (the default) turns the other fields off.
	Mode CloudEventsMode
	// Source is the source attribute of every event: a URI-reference naming
	// the producer ("/shop/orders", "urn:shop:orders",
	// "https://shop.example/orders"). Required with a Mode.
	Source string
	// Type returns the type attribute of msg's event
	// ("com.example.order.placed"); "" rejects the message. Default: the
	// message's metadata TypeMetadata.
	Type func(msg *message.Message) string
	// TypeMetadata is the metadata key of the type when Type is nil.
	// Default DefaultCloudEventsTypeMetadata. A key a binding reads as
	// another attribute ("ce_id", "ce-source", "content-type") is refused.
	TypeMetadata string
	// TimeMetadata is the metadata key of an event's time, an RFC 3339
	// time the publisher may set (e.g. when the business event happened);
	// without it, the time is the send's. Default
	// DefaultCloudEventsTimeMetadata. A key a binding reads as another
	// attribute is refused, as for TypeMetadata.
	TimeMetadata string
	// DataContentType is the datacontenttype attribute of every event
	// ("application/json") but those whose message has metadata
	// DataContentTypeMetadata; empty: left out. In structured mode a JSON
	// media type (application/json, text/json, …+json) puts a payload that
	// is valid JSON into "data" as it is; any other payload goes into
	// "data_base64".
	DataContentType string
}

// Validate reports the first impossible setting as an *outboxtype.ConfigError
// (Field "CloudEvents.…").
func (c CloudEvents) Validate() error {
	switch c.Mode {
	case CloudEventsOff:
		if c.Source != "" || c.Type != nil || c.TypeMetadata != "" || c.TimeMetadata != "" || c.DataContentType != "" {
			return &outboxtype.ConfigError{Field: "CloudEvents.Mode", Reason: "is CloudEventsOff while other CloudEvents fields are set: set CloudEventsBinary or CloudEventsStructured"}
		}
		return nil
	case CloudEventsBinary, CloudEventsStructured:
	default:
		return &outboxtype.ConfigError{Field: "CloudEvents.Mode", Reason: fmt.Sprintf("%d is no mode: CloudEventsOff, CloudEventsBinary or CloudEventsStructured", c.Mode)}
	}
	if c.Source == "" {
		return &outboxtype.ConfigError{Field: "CloudEvents.Source", Reason: "required with a Mode: a URI-reference naming the producer, e.g. /shop/orders"}
	}
	if !headerSafe(c.Source) {
		return &outboxtype.ConfigError{Field: "CloudEvents.Source", Reason: fmt.Sprintf("%q holds spaces or control characters: it is a URI-reference", c.Source)}
	}
	if _, err := url.Parse(c.Source); err != nil {
		return &outboxtype.ConfigError{Field: "CloudEvents.Source", Reason: fmt.Sprintf("%q is no URI-reference: %v", c.Source, err)}
	}
	if c.Type != nil && c.TypeMetadata != "" {
		return &outboxtype.ConfigError{Field: "CloudEvents.TypeMetadata", Reason: "set Type or TypeMetadata, not both"}
	}
	for _, f := range []struct{ field, key, attr string }{{"TypeMetadata", c.TypeMetadata, "type"}, {"TimeMetadata", c.TimeMetadata, "time"}} {
		if f.key == "" {
			continue
		}
		if !headerSafe(f.key) {
			return &outboxtype.ConfigError{Field: "CloudEvents." + f.field, Reason: fmt.Sprintf("%q is no metadata key: spaces or control characters", f.key)}
		}
		if attr, ok := bindingAttribute(f.key); ok && attr != f.attr {
			return &outboxtype.ConfigError{Field: "CloudEvents." + f.field, Reason: fmt.Sprintf("%q is the header a CloudEvents binding reads as the %s attribute: use a key of your own (e.g. event_%s), or ce_%s", f.key, attr, f.attr, f.attr)}
		}
	}
	if c.DataContentType != "" {
		mt, _, err := mime.ParseMediaType(c.DataContentType)
		if err != nil || !strings.Contains(mt, "/") || !headerSafe(strings.ReplaceAll(c.DataContentType, " ", "")) {
			return &outboxtype.ConfigError{Field: "CloudEvents.DataContentType", Reason: fmt.Sprintf("%q is no media type (RFC 2046), e.g. application/json", c.DataContentType)}
		}
	}
	return nil
}

// bindingAttribute returns the attribute a CloudEvents binding reads from
// the header key: the name after "ce_" (Kafka) or "ce-" (NATS), and
// "datacontenttype" for "content-type", compared as the bindings compare
// header names, without case.
func bindingAttribute(key string) (string, bool) {
	k := strings.ToLower(key)
	switch {
	case k == "content-type":
		return "datacontenttype", true
	case strings.HasPrefix(k, "ce_"), strings.HasPrefix(k, "ce-"):
		return k[3:], true
	}
	return "", false
}

// headerSafe reports a non-empty string without spaces or control
// characters.
func headerSafe(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// Package cloudevents builds the CloudEvents 1.0 events of outbox messages
// for the forwarder's targets (forwarder.CloudEvents): the attributes of a
// message's event, the JSON event format of structured mode, and the
// checks every binding shares. The header names and encodings of a
// binding are its target's (forwarder/kafka, forwarder/jetstream). The
// library does not link the CloudEvents SDK: the integration tests read
// what the targets send with it.
package cloudevents

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// SpecVersion is the specversion attribute of every event.
const SpecVersion = "1.0"

// StructuredMediaType is the content type of structured mode (the JSON
// event format).
const StructuredMediaType = "application/cloudevents+json"

// ContentTypeHeader is the header the bindings read datacontenttype from
// (Kafka binary mode) or the content mode (structured).
const ContentTypeHeader = "content-type"

// Event is the attributes of one event, each as its canonical string.
type Event struct {
	ID, Source, Type, Time, Subject, DataContentType, DataSchema string
}

// Attr is one attribute of an event.
type Attr struct{ Name, Value string }

// Attributes returns e's attributes that have a value, specversion first.
func (e Event) Attributes() []Attr {
	all := []Attr{
		{"specversion", SpecVersion}, {"id", e.ID}, {"source", e.Source}, {"type", e.Type},
		{"time", e.Time}, {"subject", e.Subject}, {"datacontenttype", e.DataContentType}, {"dataschema", e.DataSchema},
	}
	out := all[:0]
	for _, a := range all {
		if a.Value != "" {
			out = append(out, a)
		}
	}
	return out
}

// Of returns the event of msg, whose key (its subject; "" for none) the
// target chose, built at now. A message no event can be made of is a
// *outboxtype.MessageError.
func Of(cfg forwarder.CloudEvents, msg *message.Message, key string, now time.Time) (Event, error) {
	e := Event{ID: msg.UUID, Source: cfg.Source, Subject: key, DataContentType: cfg.DataContentType}
	if id := msg.Metadata.Get(outbox.MetadataID); id != "" {
		e.ID = id
		if source := msg.Metadata.Get(outbox.MetadataSource); source != "" {
			e.ID = source + ":" + id
		}
	}
	if cfg.Type != nil {
		e.Type = cfg.Type(msg)
	} else {
		e.Type = msg.Metadata.Get(typeKey(cfg))
	}
	if e.Type == "" {
		how := "metadata " + typeKey(cfg)
		if cfg.Type != nil {
			how = "CloudEvents.Type"
		}
		return Event{}, &outboxtype.MessageError{UUID: msg.UUID, Reason: "no CloudEvents type: " + how + " gives none"}
	}
	e.Time = now.UTC().Format(time.RFC3339Nano)
	if v := msg.Metadata.Get(timeKey(cfg)); v != "" {
		at, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return Event{}, &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("metadata %s is %q, no RFC 3339 time: %v", timeKey(cfg), v, err)}
		}
		e.Time = at.UTC().Format(time.RFC3339Nano)
	}
	if err := perMessage(&e, msg); err != nil {
		return Event{}, err
	}
	for name, v := range map[string]string{"id": e.ID, "type": e.Type, "subject": e.Subject} {
		if hasControl(v) {
			return Event{}, &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("CloudEvents %s %q holds control characters, which an attribute cannot", name, v)}
		}
	}
	return e, nil
}

// perMessage sets e's attributes that msg's metadata gives
// (forwarder.DataSchemaMetadata, forwarder.DataContentTypeMetadata), or
// refuses their values.
func perMessage(e *Event, msg *message.Message) error {
	if v := msg.Metadata.Get(forwarder.DataSchemaMetadata); v != "" {
		u, err := url.Parse(v)
		if err == nil && (u.Scheme == "" || strings.Contains(v, "#") || strings.ContainsFunc(v, notInURI)) {
			err = errors.New("not an absolute URI: scheme:path[?query], no fragment, no spaces")
		}
		if err != nil {
			return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("metadata %s is %q, no absolute URI (RFC 3986, section 4.3; e.g. https://registry:8081/schemas/ids/7): %v", forwarder.DataSchemaMetadata, v, err)}
		}
		e.DataSchema = v
	}
	if v := msg.Metadata.Get(forwarder.DataContentTypeMetadata); v != "" {
		mt, _, err := mime.ParseMediaType(v)
		if err == nil && (!strings.Contains(mt, "/") || hasControl(v)) {
			err = errors.New("no type/subtype")
		}
		if err != nil {
			return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("metadata %s is %q, no media type (RFC 2046; e.g. application/avro): %v", forwarder.DataContentTypeMetadata, v, err)}
		}
		e.DataContentType = v
	}
	return nil
}

// notInURI reports a character a URI cannot hold as it is: a space or a
// control character.
func notInURI(r rune) bool { return r <= ' ' || r >= 0x7f }

func typeKey(cfg forwarder.CloudEvents) string {
	if cfg.TypeMetadata != "" {
		return cfg.TypeMetadata
	}
	return forwarder.DefaultCloudEventsTypeMetadata
}

func timeKey(cfg forwarder.CloudEvents) string {
	if cfg.TimeMetadata != "" {
		return cfg.TimeMetadata
	}
	return forwarder.DefaultCloudEventsTimeMetadata
}

// Consumed reports whether the metadata key is one the event is made of
// (its type, even when CloudEvents.Type gives it, its time, dataschema or
// datacontenttype): a binding drops its header, the attribute's takes its
// place.
func Consumed(cfg forwarder.CloudEvents, key string) bool {
	return key == typeKey(cfg) || key == timeKey(cfg) || key == forwarder.DataSchemaMetadata || key == forwarder.DataContentTypeMetadata
}

// Reserved reports whether a receiver of the binding whose attribute
// headers start with prefix ("ce_", "ce-") reads header key as part of the
// event: an attribute or extension, or the content type.
func Reserved(key, prefix string) bool {
	k := strings.ToLower(key)
	return strings.HasPrefix(k, prefix) || k == ContentTypeHeader
}

// CheckMetadata refuses (*outboxtype.MessageError) metadata of msg that a
// receiver of the binding of prefix would read as part of the event,
// other than the keys the event is made of.
func CheckMetadata(cfg forwarder.CloudEvents, msg *message.Message, prefix string) error {
	for k := range msg.Metadata {
		if Reserved(k, prefix) && !Consumed(cfg, k) {
			return &outboxtype.MessageError{UUID: msg.UUID, Reason: fmt.Sprintf("metadata %q would be read as a CloudEvents attribute (header prefix %q, or the content type): rename it", k, prefix)}
		}
	}
	return nil
}

// Structured returns e with data in the JSON event format: data as it is
// when datacontenttype is a JSON media type and data valid JSON, else
// base64 in data_base64; no data member without data.
func Structured(e Event, data []byte) ([]byte, error) {
	var doc struct {
		SpecVersion     string          `json:"specversion"`
		ID              string          `json:"id"`
		Source          string          `json:"source"`
		Type            string          `json:"type"`
		Subject         string          `json:"subject,omitempty"`
		Time            string          `json:"time"`
		DataContentType string          `json:"datacontenttype,omitempty"`
		DataSchema      string          `json:"dataschema,omitempty"`
		Data            json.RawMessage `json:"data,omitempty"`
		DataBase64      string          `json:"data_base64,omitempty"`
	}
	doc.SpecVersion, doc.ID, doc.Source, doc.Type = SpecVersion, e.ID, e.Source, e.Type
	doc.Subject, doc.Time, doc.DataContentType, doc.DataSchema = e.Subject, e.Time, e.DataContentType, e.DataSchema
	switch {
	case len(data) == 0:
	case isJSON(e.DataContentType) && json.Valid(data):
		doc.Data = data
	default:
		doc.DataBase64 = base64.StdEncoding.EncodeToString(data)
	}
	return json.Marshal(doc)
}

// isJSON reports a JSON media type: application/json, text/json, or a
// +json suffix.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// hasControl reports a control character (U+0000–U+001F, U+007F–U+009F),
// which no attribute value may hold.
func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return true
		}
	}
	return false
}

// PercentEncode encodes a header value as the NATS binding requires:
// space, '"', '%' and every character outside printable ASCII as %XX of
// its UTF-8 bytes.
func PercentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > ' ' && c < 0x7f && c != '"' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

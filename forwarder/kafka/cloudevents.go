package kafka

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/cloudevents"
)

// CloudEvents into Kafka (Config.CloudEvents), as the CloudEvents Kafka
// protocol binding 1.0 defines them:
//
//   - binary mode: the value is the event's data; each attribute is a
//     header "ce_<name>" (ce_specversion "1.0", ce_id, ce_source, ce_type,
//     ce_time, ce_subject), but datacontenttype, which is header
//     content-type;
//   - structured mode: the value is the event in the JSON event format
//     (data or data_base64 inside), header content-type
//     "application/cloudevents+json"; a receiver tells the modes apart by
//     it, record by record;
//   - a tombstone has a null value in binary mode; the binding defines no
//     structured tombstone (a structured event without data still has a
//     value, which compaction keeps as the key's value), so a tombstone is
//     sent in binary mode in structured mode too.
//
// The Marshaler's headers (the metadata, the UUID, the outbox_* headers
// the exactly-once tail read finds its records by) stay, in both modes;
// those a receiver would read as part of the event (ce_…, content-type)
// are refused in metadata (cloudevents.CheckMetadata) and dropped when a
// custom Marshaler writes them, but for the type and time metadata, whose
// attribute headers take their place.

// headerPrefix starts the header of each attribute in binary mode.
const headerPrefix = "ce_"

// cloudEvent makes r, the record of msg (tomb: a tombstone), the event of
// msg in cfg's mode.
func cloudEvent(cfg forwarder.CloudEvents, r *kgo.Record, msg *message.Message, tomb bool) error {
	if err := cloudevents.CheckMetadata(cfg, msg, headerPrefix); err != nil {
		return err
	}
	ev, err := cloudevents.Of(cfg, msg, string(r.Key), time.Now())
	if err != nil {
		return err
	}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+8)
	for _, h := range r.Headers {
		if !cloudevents.Reserved(h.Key, headerPrefix) {
			headers = append(headers, h)
		}
	}
	if cfg.Mode == forwarder.CloudEventsStructured && !tomb {
		value, err := cloudevents.Structured(ev, r.Value)
		if err != nil {
			return fmt.Errorf("CloudEvents JSON of message %s: %w", msg.UUID, err)
		}
		r.Value = value
		r.Headers = append(headers, kgo.RecordHeader{Key: cloudevents.ContentTypeHeader, Value: []byte(cloudevents.StructuredMediaType)})
		return nil
	}
	for _, a := range ev.Attributes() {
		key := headerPrefix + a.Name
		if a.Name == "datacontenttype" {
			key = cloudevents.ContentTypeHeader
		}
		headers = append(headers, kgo.RecordHeader{Key: key, Value: []byte(a.Value)})
	}
	r.Headers = headers
	return nil
}

// Package cetest reads CloudEvents the way the CloudEvents Go SDK's
// protocol bindings read them, so that the tests check what the
// forwarder's targets send against the SDK (github.com/cloudevents/sdk-go/v2:
// its binding, format and spec packages do the reading; binding.ToEvent
// builds and validates the event).
//
// The SDK's Kafka and NATS bindings live in modules of their own
// (protocol/kafka_sarama/v2, protocol/nats_jetstream/v3) that the module
// proxy does not serve; their message readers are small, and KafkaMessage
// and NATSMessage are copies of them (sdk-go at d6f40309, Apache-2.0): the
// same rules for the content mode, the header prefixes and the content
// type, over a kgo.Record and a NATS message's header and body instead of
// a sarama.ConsumerMessage and a jetstream.Msg.
package cetest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kgo"
)

const contentTypeHeader = "content-type"

// kafkaSpecs and natsSpecs are the bindings' attribute header prefixes.
var (
	kafkaSpecs = spec.WithPrefix("ce_")
	natsSpecs  = spec.WithPrefix("ce-")
)

// KafkaMessage is kafka_sarama.Message: header keys lower-cased; a
// content-type of a known event format is structured mode, else a
// ce_specversion header binary mode.
type KafkaMessage struct {
	value   []byte
	headers map[string][]byte
	format  format.Format
	version spec.Version
}

// FromKafka wraps a record as kafka_sarama.NewMessageFromConsumerMessage
// wraps a consumed message (without its ce_kafka* extensions).
func FromKafka(r *kgo.Record) *KafkaMessage {
	var contentType string
	headers := make(map[string][]byte, len(r.Headers))
	for _, h := range r.Headers {
		k := strings.ToLower(h.Key)
		if k == contentTypeHeader {
			contentType = string(h.Value)
		}
		headers[k] = h.Value
	}
	m := &KafkaMessage{value: r.Value, headers: headers}
	if ft := format.Lookup(contentType); ft != nil {
		m.format = ft
	} else if v := kafkaSpecs.Version(string(headers[kafkaSpecs.PrefixedSpecVersionName()])); v != nil {
		m.version = v
	}
	return m
}

// ReadEncoding implements binding.MessageReader.
func (m *KafkaMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.version != nil:
		return binding.EncodingBinary
	case m.format != nil:
		return binding.EncodingStructured
	}
	return binding.EncodingUnknown
}

// ReadStructured implements binding.MessageReader.
func (m *KafkaMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.value))
}

// ReadBinary implements binding.MessageReader.
func (m *KafkaMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.headers {
		var err error
		if strings.HasPrefix(k, "ce_") {
			if attr := m.version.Attribute(k); attr != nil {
				err = w.SetAttribute(attr, string(v))
			} else {
				err = w.SetExtension(strings.TrimPrefix(k, "ce_"), string(v))
			}
		} else if k == contentTypeHeader {
			err = w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), string(v))
		}
		if err != nil {
			return err
		}
	}
	if m.value != nil {
		return w.SetData(bytes.NewBuffer(m.value))
	}
	return nil
}

// GetAttribute implements binding.MessageMetadataReader.
func (m *KafkaMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	if m.version == nil {
		return nil, nil
	}
	if attr := m.version.AttributeFromKind(k); attr != nil {
		return attr, string(m.headers[attr.PrefixedName()])
	}
	return nil, nil
}

// GetExtension implements binding.MessageMetadataReader.
func (m *KafkaMessage) GetExtension(name string) interface{} {
	return string(m.headers["ce_"+name])
}

// Finish implements binding.Message.
func (m *KafkaMessage) Finish(error) error { return nil }

// NATSMessage is nats_jetstream.Message (v3): structured mode unless a
// ce-specversion header is there; structured bodies are JSON.
type NATSMessage struct {
	header nats.Header
	data   []byte
}

// FromNATS wraps a NATS message's header and body as
// nats_jetstream.NewMessage wraps a jetstream.Msg.
func FromNATS(header nats.Header, data []byte) *NATSMessage {
	return &NATSMessage{header: header, data: data}
}

// ReadEncoding implements binding.MessageReader.
func (m *NATSMessage) ReadEncoding() binding.Encoding {
	if m.header != nil && m.header.Get(natsSpecs.PrefixedSpecVersionName()) != "" {
		return binding.EncodingBinary
	}
	return binding.EncodingStructured
}

// ReadStructured implements binding.MessageReader.
func (m *NATSMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.ReadEncoding() != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, format.JSON, bytes.NewReader(m.data))
}

// ReadBinary implements binding.MessageReader.
func (m *NATSMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.ReadEncoding() != binding.EncodingBinary {
		return binding.ErrNotBinary
	}
	version := natsSpecs.Version(m.header.Get(natsSpecs.PrefixedSpecVersionName()))
	if version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.header {
		var err error
		if strings.HasPrefix(k, "ce-") {
			if attr := version.Attribute(k); attr != nil {
				err = w.SetAttribute(attr, v[0])
			} else {
				err = w.SetExtension(strings.TrimPrefix(k, "ce-"), v[0])
			}
		} else if k == contentTypeHeader {
			err = w.SetAttribute(version.AttributeFromKind(spec.DataContentType), v[0])
		}
		if err != nil {
			return err
		}
	}
	if m.data != nil {
		return w.SetData(bytes.NewBuffer(m.data))
	}
	return nil
}

// GetAttribute implements binding.MessageMetadataReader.
func (m *NATSMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	version := natsSpecs.Version(m.header.Get(natsSpecs.PrefixedSpecVersionName()))
	if version == nil {
		return nil, nil
	}
	key := "ce-" + k.String()
	if v := m.header.Get(key); v != "" {
		return version.Attribute(key), v
	}
	return version.Attribute(key), nil
}

// GetExtension implements binding.MessageMetadataReader.
func (m *NATSMessage) GetExtension(name string) interface{} {
	if v := m.header.Get("ce-" + name); v != "" {
		return v
	}
	return nil
}

// Finish implements binding.Message.
func (m *NATSMessage) Finish(error) error { return nil }

var (
	_ binding.MessageMetadataReader = (*KafkaMessage)(nil)
	_ binding.MessageMetadataReader = (*NATSMessage)(nil)
)

// Event reads m with binding.ToEvent and validates the event (the required
// attributes, their types): what a CloudEvents SDK consumer gets. It fails
// the test when either fails.
func Event(t testing.TB, m binding.Message) *event.Event {
	t.Helper()
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		t.Fatalf("the CloudEvents SDK cannot read the message (%v encoding): %v", m.ReadEncoding(), err)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("the CloudEvents SDK finds the event invalid: %v\n%s", err, ev)
	}
	return ev
}

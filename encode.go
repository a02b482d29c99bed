package outbox

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// encodedBatch is a Publish call's messages, encoded column by column for
// the one statement that writes them.
type encodedBatch struct {
	partitions []int32
	keys       []string
	uuids      []string
	metadata   []string
	payloads   [][]byte
	bytes      int // payloads, metadata, uuids and keys, as counted for MaxPublishBytes
}

// encode validates every message and turns the batch into column arrays, so
// that nothing is written when any message is bad.
func (p *Publisher) encode(topic string, ts *topicState, msgs []*message.Message) (encodedBatch, error) {
	b := encodedBatch{
		partitions: make([]int32, len(msgs)),
		keys:       make([]string, len(msgs)),
		uuids:      make([]string, len(msgs)),
		metadata:   make([]string, len(msgs)),
		payloads:   make([][]byte, len(msgs)),
	}
	var buf []byte
	total := 0
	for i, m := range msgs {
		if len(m.Payload) > p.cfg.MaxPayloadBytes {
			return b, &outboxtype.PayloadTooLargeError{UUID: m.UUID, Size: len(m.Payload), Limit: p.cfg.MaxPayloadBytes}
		}
		if !pgtext.Storable(m.UUID) {
			return b, &outboxtype.MessageError{UUID: strconv.Quote(m.UUID), Reason: "UUID must be valid UTF-8 without NUL bytes"}
		}
		if err := checkDelay(m); err != nil {
			return b, err
		}
		key, err := p.cfg.PartitionKeyFunc(topic, m)
		if err != nil {
			return b, &outboxtype.MessageError{UUID: m.UUID, Reason: "PublisherConfig.PartitionKeyFunc failed on it (nothing of the call was written)", Err: err}
		}
		if !pgtext.Storable(key) {
			return b, &outboxtype.MessageError{UUID: m.UUID, Reason: "partition key must be valid UTF-8 without NUL bytes"}
		}
		if err := checkTombstone(m, key); err != nil {
			return b, err
		}
		var part int
		if key == "" {
			part = int(ts.next.Add(1)-1) % ts.partitions
		} else if part, err = p.cfg.Partitioner.Partition(key, ts.partitions); err != nil {
			return b, &outboxtype.MessageError{UUID: m.UUID, Reason: "PublisherConfig.Partitioner failed on it (nothing of the call was written)", Err: err}
		} else if part < 0 || part >= ts.partitions {
			return b, &outboxtype.MessageError{UUID: m.UUID, Reason: fmt.Sprintf("partitioner returned %d for %d partitions", part, ts.partitions)}
		}
		raw := 0
		for k, v := range m.Metadata {
			raw += len(k) + len(v)
		}
		if raw > p.cfg.MaxMetadataBytes { // (before encoding it: JSON only grows)
			return b, &outboxtype.LimitError{Limit: "MaxMetadataBytes", UUID: m.UUID, Size: raw, Max: p.cfg.MaxMetadataBytes}
		}
		buf, err = appendMetadataJSON(buf[:0], m.Metadata)
		if err != nil {
			return b, &outboxtype.MessageError{UUID: m.UUID, Reason: err.Error()}
		}
		if len(buf) > p.cfg.MaxMetadataBytes {
			return b, &outboxtype.LimitError{Limit: "MaxMetadataBytes", UUID: m.UUID, Size: len(buf), Max: p.cfg.MaxMetadataBytes}
		}
		if total += len(buf) + len(m.Payload) + len(m.UUID) + len(key); total > p.cfg.MaxPublishBytes {
			return b, &outboxtype.LimitError{Limit: "MaxPublishBytes", UUID: "", Size: total, Max: p.cfg.MaxPublishBytes}
		}
		b.partitions[i] = int32(part)
		b.keys[i] = key
		b.uuids[i] = m.UUID
		b.metadata[i] = string(buf)
		b.payloads[i] = nonNil(m.Payload)
	}
	b.bytes = total
	return b, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// appendMetadataJSON encodes metadata as a JSON object. Keys and values must
// be valid UTF-8 without NUL (jsonb cannot hold \u0000), so that they come
// back byte-exact.
func appendMetadataJSON(dst []byte, md message.Metadata) ([]byte, error) {
	dst = append(dst, '{')
	first := true
	for k, v := range md {
		if !pgtext.Storable(k) || !pgtext.Storable(v) {
			return nil, fmt.Errorf("metadata %q must be valid UTF-8 without NUL bytes", k)
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = appendJSONString(dst, v)
	}
	return append(dst, '}'), nil
}

const hexDigits = "0123456789abcdef"

func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

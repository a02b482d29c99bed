// Package walrecord encodes an outbox message as the content of one
// pg_logical_emit_message record (the log-based publishing mode) and
// decodes it in the relay.
//
// Layout, version 1:
//
//	byte     version (1)
//	uvarint  partition
//	uvarint  len(topic)     topic
//	uvarint  len(key)       partition key ("" for none)
//	uvarint  len(uuid)      uuid
//	uvarint  len(metadata)  metadata (a JSON object)
//	...      payload (the rest of the record)
//
// A relay refuses a version it does not know (ErrVersion: a newer publisher
// wrote it; upgrade the relay) instead of guessing.
package walrecord

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the record layout this package writes.
const Version = 1

// ErrVersion reports a record of a layout this release cannot read.
var ErrVersion = errors.New("walrecord: record written by a newer release (unknown version); upgrade the relay")

// ErrCorrupt reports a record that is not a valid version-1 layout.
var ErrCorrupt = errors.New("walrecord: corrupt record")

// Message is one decoded record. Decode's strings and Payload alias the
// record's bytes.
type Message struct {
	Partition int32
	Topic     string
	Key       string
	UUID      string
	Metadata  string
	Payload   []byte
}

// Append appends the record of m to dst.
func Append(dst []byte, partition int32, topic, key, uuid, metadata string, payload []byte) []byte {
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, uint64(partition))
	for _, s := range [...]string{topic, key, uuid, metadata} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return append(dst, payload...)
}

// Size is the length of the record Append writes.
func Size(topic, key, uuid, metadata string, payload []byte) int {
	n := 1 + binary.MaxVarintLen32 + len(payload)
	for _, s := range [...]string{topic, key, uuid, metadata} {
		n += binary.MaxVarintLen64 + len(s)
	}
	return n
}

// Decode reads a record.
func Decode(rec []byte) (Message, error) {
	var m Message
	if len(rec) == 0 {
		return m, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if rec[0] != Version {
		return m, fmt.Errorf("%w: version %d, this release reads %d", ErrVersion, rec[0], Version)
	}
	rest := rec[1:]
	p, n := binary.Uvarint(rest)
	if n <= 0 || p > 1<<31-1 {
		return m, fmt.Errorf("%w: partition", ErrCorrupt)
	}
	m.Partition, rest = int32(p), rest[n:]
	fields := [4]*string{&m.Topic, &m.Key, &m.UUID, &m.Metadata}
	for i, f := range fields {
		l, n := binary.Uvarint(rest)
		if n <= 0 || l > uint64(len(rest)-n) {
			return m, fmt.Errorf("%w: field %d", ErrCorrupt, i+1)
		}
		*f, rest = string(rest[n:n+int(l)]), rest[n+int(l):]
	}
	m.Payload = rest
	return m, nil
}

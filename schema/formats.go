package schema

import (
	"fmt"
)

// codecFor is a schema compiled for one format: what the Codec needs of
// Avro, Protobuf and JSON Schema alike.
type codecFor interface {
	// record is the record's full name (for the RecordName strategies).
	record() string
	// index is the Confluent message index of a Protobuf message (nil for
	// the other formats).
	index() []int
	// validate checks a record (the wire format's body, after the header).
	validate(body []byte) error
	// encode appends the encoding of the Go value v to dst.
	encode(dst []byte, v any) ([]byte, error)
	// decode decodes a record into the Go value v (a pointer).
	decode(body []byte, v any) error
	// json renders a record as JSON text.
	json(body []byte) ([]byte, error)
}

// compile parses text as a schema of format f. message picks the Protobuf
// message ("" the first one); index, for Protobuf records read from the
// wire, picks it by its Confluent message index instead.
func compile(f Format, text, message string, index []int) (codecFor, error) {
	switch f {
	case Avro:
		return compileAvro(text)
	case Protobuf:
		return compileProtobuf(text, message, index)
	case JSONSchema:
		return compileJSONSchema(text)
	}
	return nil, fmt.Errorf("format %v is not supported", f)
}

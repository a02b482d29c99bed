package schema

import (
	"encoding/json"
	"fmt"

	"github.com/hamba/avro/v2"
)

// avroCodec is an Avro schema.
type avroCodec struct {
	schema avro.Schema
	name   string
}

func compileAvro(text string) (*avroCodec, error) {
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	c := &avroCodec{schema: s}
	if named, ok := s.(avro.NamedSchema); ok {
		c.name = named.FullName()
	}
	return c, nil
}

func (c *avroCodec) record() string { return c.name }
func (c *avroCodec) index() []int   { return nil }

// validate reads the record with the schema (checkAvroRecord: as decoding
// it would, without building it) and checks that it is all of the body: a
// record that decodes with bytes left over is another record's, or
// garbage.
func (c *avroCodec) validate(body []byte) error {
	return checkAvroRecord(c.schema, body)
}

func (c *avroCodec) encode(dst []byte, v any) ([]byte, error) {
	b, err := avro.Marshal(c.schema, v)
	if err != nil {
		return nil, fmt.Errorf("cannot encode a %T with this schema: %w", v, err)
	}
	return append(dst, b...), nil
}

func (c *avroCodec) decode(body []byte, v any) error {
	if err := avro.Unmarshal(c.schema, body, v); err != nil {
		return fmt.Errorf("cannot decode into a %T: %w", v, err)
	}
	return nil
}

func (c *avroCodec) json(body []byte) ([]byte, error) {
	var v any
	if err := avro.Unmarshal(c.schema, body, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

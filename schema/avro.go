package schema

import (
	"encoding/json"
	"errors"
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

// validate decodes the record with the schema and checks that it is all
// of the body: a record that decodes with bytes left over is another
// record's, or garbage.
func (c *avroCodec) validate(body []byte) error {
	r := avro.NewReader(nil, 0).Reset(body)
	var v any
	r.ReadVal(c.schema, &v)
	if r.Error != nil {
		return fmt.Errorf("not an Avro record of this schema: %w", r.Error)
	}
	r.Peek()
	if r.Error == nil {
		return errors.New("not an Avro record of this schema: bytes are left over after the record")
	}
	return nil
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

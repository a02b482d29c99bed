package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/hamba/avro/v2"
)

// avroCodec is an Avro schema.
type avroCodec struct {
	schema avro.Schema
	name   string
	// targets caches, per struct type decoded into, whether it has a
	// field for each of the record's (nil) or which it lacks.
	targets sync.Map // reflect.Type → error
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
	if err := c.checkTarget(v); err != nil {
		return err
	}
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
	// The text is shown to people (the CLI, the console, which escape it
	// for their page): "<" stays "<", not "\u003c".
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// checkTarget refuses a struct target that has none of the record's
// fields (hamba/avro would skip them all and leave a zero value): a Go type
// of another record. A struct that lacks some of the record's fields (an
// older version of the type reading a newer record) or has fields the
// record lacks (a newer type reading an older record) is fine: as Avro's
// schema resolution does, the former are skipped and the latter stay zero.
// Maps and interfaces take any record.
func (c *avroCodec) checkTarget(v any) error {
	rec, ok := c.schema.(*avro.RecordSchema)
	if !ok {
		return nil
	}
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return fmt.Errorf("decode into a pointer, not a %T", v)
	}
	t = t.Elem()
	if t.Kind() != reflect.Struct {
		return nil
	}
	if known, ok := c.targets.Load(t); ok {
		if known != nil {
			return known.(error)
		}
		return nil
	}
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("avro"); ok {
			name, _, _ = strings.Cut(tag, ",")
		}
		names[name] = true
	}
	for _, f := range rec.Fields() {
		if names[f.Name()] {
			c.targets.Store(t, nil)
			return nil
		}
	}
	err := fmt.Errorf("the Go type %v has none of the fields of the record %s: decode into a type of this record (fields tagged `avro:\"name\"`)", t, rec.FullName())
	c.targets.Store(t, err)
	return err
}

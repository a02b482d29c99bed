package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonSchemaCodec is a JSON Schema.
type jsonSchemaCodec struct {
	schema *jsonschema.Schema
	title  string
}

// schemaURL is where the compiler keeps the schema: it loads nothing from
// the network or the file system ($ref to another document fails).
const schemaURL = "mem:///schema.json"

func compileJSONSchema(text string) (*jsonSchemaCodec, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, err
	}
	codec := &jsonSchemaCodec{schema: s}
	if obj, ok := doc.(map[string]any); ok {
		codec.title, _ = obj["title"].(string)
	}
	return codec, nil
}

func (c *jsonSchemaCodec) record() string { return c.title }
func (c *jsonSchemaCodec) index() []int   { return nil }

func (c *jsonSchemaCodec) validate(body []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if err := c.schema.Validate(inst); err != nil {
		return fmt.Errorf("%s", strings.TrimPrefix(strings.ReplaceAll(err.Error(), "\n", "; "), "jsonschema validation failed with '"+schemaURL+"#'; "))
	}
	return nil
}

func (c *jsonSchemaCodec) encode(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("cannot encode a %T as JSON: %w", v, err)
	}
	if err := c.validate(b); err != nil {
		return nil, fmt.Errorf("a %T does not match this schema: %w", v, err)
	}
	return append(dst, b...), nil
}

func (c *jsonSchemaCodec) decode(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("cannot decode into a %T: %w", v, err)
	}
	return nil
}

func (c *jsonSchemaCodec) json(body []byte) ([]byte, error) {
	if !json.Valid(body) {
		return nil, fmt.Errorf("not JSON")
	}
	return body, nil
}

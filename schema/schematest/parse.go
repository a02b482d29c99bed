package schematest

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// parsed is a schema parsed by its type's parser: what the compatibility
// rules compare.
type parsed struct {
	typ   sr.SchemaType
	avro  avro.Schema
	proto protoreflect.FileDescriptor
	json  any // the JSON Schema document, objects as map[string]any
}

// namedSchema is a referenced schema under the name its referrer uses.
type namedSchema struct {
	name   string
	schema sr.Schema
}

// maxReferenceDepth bounds how deep references may nest.
const maxReferenceDepth = 32

// parse parses sch, with the schemas it references, by its type's parser.
// A schema the parser refuses is the registry's 422 with error code
// 42201, the parser's message in it. st.mu is held.
func (st *store) parse(sch sr.Schema) (*parsed, *apiError) {
	if strings.TrimSpace(sch.Schema) == "" {
		return nil, errInvalidSchema("Invalid schema of type %s: the schema text is empty", sch.Type)
	}
	var refs []namedSchema
	if aerr := st.references(sch.References, 0, map[string]bool{}, &refs); aerr != nil {
		return nil, aerr
	}
	var (
		p   *parsed
		err error
	)
	switch sch.Type {
	case sr.TypeAvro:
		p, err = parseAvro(sch.Schema, refs)
	case sr.TypeProtobuf:
		p, err = parseProtobuf(sch.Schema, refs)
	case sr.TypeJSON:
		p, err = parseJSON(sch.Schema, refs)
	default:
		return nil, errInvalidSchema("Invalid schema: unknown schema type %d", int(sch.Type))
	}
	if err != nil {
		return nil, errInvalidSchema("Invalid schema of type %s, details: %v", sch.Type, err)
	}
	return p, nil
}

// references appends the schemas refs name to out, each after the
// schemas it references itself. st.mu is held.
func (st *store) references(refs []sr.SchemaReference, depth int, seen map[string]bool, out *[]namedSchema) *apiError {
	if len(refs) > 0 && depth >= maxReferenceDepth {
		return errInvalidSchema("Invalid schema: references nest deeper than %d", maxReferenceDepth)
	}
	for _, r := range refs {
		if r.Name == "" || r.Subject == "" || r.Version == 0 {
			return errInvalidSchema("Invalid schema: reference %+v needs a name, a subject and a version", r)
		}
		s := st.subjects[r.Subject]
		var v *version
		if s != nil {
			if r.Version == -1 {
				if live := s.live(); len(live) > 0 {
					v = live[len(live)-1]
				}
			} else {
				v = s.find(r.Version, false)
			}
		}
		if v == nil {
			return errInvalidSchema("Invalid schema: reference %q: subject %q has no version %d: register the referenced schema first", r.Name, r.Subject, r.Version)
		}
		if seen[r.Name] {
			continue
		}
		seen[r.Name] = true
		ref := st.byID[v.id].schema
		if aerr := st.references(ref.References, depth+1, seen, out); aerr != nil {
			return aerr
		}
		*out = append(*out, namedSchema{name: r.Name, schema: ref})
	}
	return nil
}

// parseAvro parses an Avro schema; the named types its references define
// are known to it by their full names.
func parseAvro(text string, refs []namedSchema) (*parsed, error) {
	cache := &avro.SchemaCache{} // never the package's global cache: another version of a type must not leak in
	for _, r := range refs {
		if r.schema.Type != sr.TypeAvro {
			return nil, fmt.Errorf("reference %q is a %s schema, not AVRO", r.name, r.schema.Type)
		}
		if _, err := avro.ParseWithCache(r.schema.Schema, "", cache); err != nil {
			return nil, fmt.Errorf("reference %q: %w", r.name, err)
		}
	}
	s, err := avro.ParseWithCache(text, "", cache)
	if err != nil {
		return nil, err
	}
	return &parsed{typ: sr.TypeAvro, avro: s}, nil
}

// protoFileName is the name the parsed .proto file has (in messages).
const protoFileName = "schema.proto"

// parseProtobuf compiles a .proto file; its imports are its references
// (by their names) and the well-known types google/protobuf/*.proto.
func parseProtobuf(text string, refs []namedSchema) (*parsed, error) {
	files := map[string]string{protoFileName: text}
	for _, r := range refs {
		if r.schema.Type != sr.TypeProtobuf {
			return nil, fmt.Errorf("reference %q is a %s schema, not PROTOBUF", r.name, r.schema.Type)
		}
		if r.name == protoFileName {
			return nil, fmt.Errorf("reference name %q is reserved by the stand-in: name the import otherwise", r.name)
		}
		files[r.name] = r.schema.Schema
	}
	c := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(files)}),
		MaxParallelism: 1,
	}
	out, err := c.Compile(context.Background(), protoFileName)
	if err != nil {
		return nil, err
	}
	return &parsed{typ: sr.TypeProtobuf, proto: out[0]}, nil
}

// jsonBase is the URL a JSON Schema without an $id has, against which
// relative reference names resolve.
const jsonBase = "mem://schematest/"

// parseJSON compiles a JSON Schema (the drafts santhosh-tekuri/jsonschema
// knows, 2020-12 by default); a "$ref" may name one of its references,
// nothing else outside the document.
func parseJSON(text string, refs []namedSchema) (*parsed, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refusingLoader{})
	for _, r := range refs {
		if r.schema.Type != sr.TypeJSON {
			return nil, fmt.Errorf("reference %q is a %s schema, not JSON", r.name, r.schema.Type)
		}
		rdoc, err := jsonschema.UnmarshalJSON(strings.NewReader(r.schema.Schema))
		if err != nil {
			return nil, fmt.Errorf("reference %q: %w", r.name, err)
		}
		if err := c.AddResource(jsonRefURL(r.name), rdoc); err != nil {
			return nil, fmt.Errorf("reference %q: %w", r.name, err)
		}
	}
	if err := c.AddResource(jsonBase+"schema.json", doc); err != nil {
		return nil, err
	}
	if _, err := c.Compile(jsonBase + "schema.json"); err != nil {
		return nil, err
	}
	return &parsed{typ: sr.TypeJSON, json: doc}, nil
}

// jsonRefURL is the URL of a JSON reference: its name if absolute, else
// the name under jsonBase.
func jsonRefURL(name string) string {
	if u, err := url.Parse(name); err == nil && u.IsAbs() {
		return name
	}
	return jsonBase + strings.TrimPrefix(name, "/")
}

// refusingLoader refuses to load anything: a stand-in reads no files and
// fetches no URLs.
type refusingLoader struct{}

func (refusingLoader) Load(u string) (any, error) {
	return nil, fmt.Errorf("$ref %s is neither in the schema nor one of its references", u)
}

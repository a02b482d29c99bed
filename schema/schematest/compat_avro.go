package schematest

import (
	"fmt"
	"slices"

	"github.com/hamba/avro/v2"
)

// Avro compatibility is hamba/avro's schema resolution
// (avro.SchemaCompatibility: can reader read what writer wrote?). Its
// answer says what broke but not always where (a changed field type is
// "reader schema string not compatible with writer schema int"), so
// avroIncompatibilities walks the records itself, asking hamba about each
// field, to name the field and its path (Confluent's "/fields/2/type").

// avroIncompatibilities lists why reader cannot read data written with
// writer; nil when it can.
func avroIncompatibilities(reader, writer avro.Schema, readerRole, writerRole string) []problem {
	w := avroWalk{sc: avro.NewSchemaCompatibility(), seen: map[[2][32]byte]bool{}, readerRole: readerRole, writerRole: writerRole}
	return w.walk(reader, writer, "", "the schema")
}

type avroWalk struct {
	sc                     *avro.SchemaCompatibility
	seen                   map[[2][32]byte]bool // reader and writer fingerprints walked: recursive types end
	readerRole, writerRole string
}

// walk explains why reader (at path, described by what) cannot read
// writer.
func (w *avroWalk) walk(reader, writer avro.Schema, path, what string) []problem {
	err := w.sc.Compatible(reader, writer)
	if err == nil {
		return nil
	}
	reader, writer = deref(reader), deref(writer)
	pair := [2][32]byte{reader.Fingerprint(), writer.Fingerprint()}
	if w.seen[pair] {
		return nil // reported where the walk met this pair first
	}
	w.seen[pair] = true
	switch r := reader.(type) {
	case *avro.RecordSchema:
		if wr, ok := writer.(*avro.RecordSchema); ok && sameName(r, wr) {
			if probs := w.fields(r, wr, path); len(probs) > 0 {
				return probs
			}
		}
	case *avro.ArraySchema:
		if wa, ok := writer.(*avro.ArraySchema); ok {
			return w.walk(r.Items(), wa.Items(), path+"/items", "the items of "+what)
		}
	case *avro.MapSchema:
		if wm, ok := writer.(*avro.MapSchema); ok {
			return w.walk(r.Values(), wm.Values(), path+"/values", "the values of "+what)
		}
	}
	at := path
	if at == "" {
		at = "/"
	}
	return []problem{{avroKind(reader, writer), fmt.Sprintf("%s (path %s): the %s schema cannot read data of the %s schema: %v", what, at, w.readerRole, w.writerRole, err)}}
}

// fields explains field by field why record reader cannot read record
// writer.
func (w *avroWalk) fields(reader, writer *avro.RecordSchema, path string) []problem {
	var out []problem
	for i, f := range reader.Fields() {
		fpath := fmt.Sprintf("%s/fields/%d", path, i)
		wf := writerField(writer, f)
		if wf == nil {
			if !f.HasDefault() {
				out = append(out, problem{"READER_FIELD_MISSING_DEFAULT_VALUE",
					fmt.Sprintf("field %s (path %s) has no default value and is missing in the %s schema", f.Name(), fpath, w.writerRole)})
			}
			continue
		}
		out = append(out, w.walk(f.Type(), wf.Type(), fpath+"/type", "the type of field "+f.Name())...)
	}
	return out
}

// writerField is the field of writer that reader's field f reads: the
// one of its name or of one of its aliases (as hamba/avro matches them).
func writerField(writer *avro.RecordSchema, f *avro.Field) *avro.Field {
	for _, wf := range writer.Fields() {
		if wf.Name() == f.Name() || slices.Contains(f.Aliases(), wf.Name()) {
			return wf
		}
	}
	return nil
}

func deref(s avro.Schema) avro.Schema {
	if r, ok := s.(*avro.RefSchema); ok {
		return r.Schema()
	}
	return s
}

func sameName(reader, writer avro.NamedSchema) bool {
	return reader.Name() == writer.Name() || slices.Contains(reader.Aliases(), writer.FullName())
}

// avroKind is Confluent's errorType for an incompatibility between reader
// and writer that is not a missing field.
func avroKind(reader, writer avro.Schema) string {
	switch {
	case reader.Type() == avro.Union || writer.Type() == avro.Union:
		return "MISSING_UNION_BRANCH"
	case reader.Type() != writer.Type():
		return "TYPE_MISMATCH"
	}
	rn, rok := reader.(avro.NamedSchema)
	wn, wok := writer.(avro.NamedSchema)
	switch {
	case rok && wok && !sameName(rn, wn):
		return "NAME_MISMATCH"
	case reader.Type() == avro.Enum:
		return "MISSING_ENUM_SYMBOLS"
	case reader.Type() == avro.Fixed:
		return "FIXED_SIZE_MISMATCH"
	}
	return "TYPE_MISMATCH"
}

package schema

import (
	"errors"
	"fmt"
	"sync"

	"github.com/hamba/avro/v2"
)

// maxAvroDepth bounds the nesting of the values checkAvro reads (a
// recursive schema, a linked list say, nests as deep as its record).
const maxAvroDepth = 256

// readers are the Avro readers of validate, reused: validating reads the
// record in place and builds nothing, so that a message costs no garbage.
var readers = sync.Pool{New: func() any { return avro.NewReader(nil, 0) }}

// checkAvroRecord checks that body is one Avro record of s and nothing
// more: every value decodes (lengths not negative and within the body,
// enum symbols and union branches that exist, varints that end), as
// decoding it would, without building the value.
func checkAvroRecord(s avro.Schema, body []byte) error {
	r := readers.Get().(*avro.Reader)
	defer readers.Put(r)
	r.Reset(body)
	r.Error = nil
	c := avroChecker{r: r, items: int64(len(body)) + maxZeroWidthItems}
	c.value(s, 0)
	if r.Error != nil {
		return fmt.Errorf("not an Avro record of this schema: %w", r.Error)
	}
	r.Peek()
	if r.Error == nil {
		return errors.New("not an Avro record of this schema: bytes are left over after the record")
	}
	r.Error = nil
	return nil
}

// maxZeroWidthItems is how many more array items or map entries than the
// body has bytes a record may hold (items that take no byte: nulls, empty
// records), so that a forged block count cannot make the check loop for
// long.
const maxZeroWidthItems = 1 << 16

// avroChecker reads values off r; items is what is left of the array items
// and map entries a record may hold.
type avroChecker struct {
	r     *avro.Reader
	items int64
}

// value reads one value of s, recording the first problem in r.Error.
func (c *avroChecker) value(s avro.Schema, depth int) {
	r := c.r
	if r.Error != nil {
		return
	}
	if depth > maxAvroDepth {
		r.ReportError("validate", fmt.Sprintf("values nested deeper than %d", maxAvroDepth))
		return
	}
	switch s := s.(type) {
	case *avro.NullSchema:
	case *avro.PrimitiveSchema:
		switch s.Type() {
		case avro.Boolean:
			r.ReadBool()
		case avro.Int:
			r.ReadInt()
		case avro.Long:
			r.ReadLong()
		case avro.Float:
			r.SkipNBytes(4)
		case avro.Double:
			r.SkipNBytes(8)
		case avro.String, avro.Bytes:
			c.skipSized(string(s.Type()))
		case avro.Null:
		default:
			r.ReportError("validate", fmt.Sprintf("unsupported type %s", s.Type()))
		}
	case *avro.RecordSchema:
		for _, f := range s.Fields() {
			c.value(f.Type(), depth+1)
		}
	case *avro.RefSchema:
		c.value(s.Schema(), depth+1)
	case *avro.EnumSchema:
		if i := r.ReadInt(); r.Error == nil && (i < 0 || int(i) >= len(s.Symbols())) {
			r.ReportError("validate", fmt.Sprintf("enum %s has no symbol %d", s.FullName(), i))
		}
	case *avro.UnionSchema:
		i := r.ReadLong()
		if r.Error != nil {
			return
		}
		if i < 0 || i >= int64(len(s.Types())) {
			r.ReportError("validate", fmt.Sprintf("the union has no branch %d", i))
			return
		}
		c.value(s.Types()[i], depth+1)
	case *avro.FixedSchema:
		r.SkipNBytes(s.Size())
	case *avro.ArraySchema:
		c.blocks(func() { c.value(s.Items(), depth+1) })
	case *avro.MapSchema:
		c.blocks(func() {
			c.skipSized("map key")
			c.value(s.Values(), depth+1)
		})
	default:
		r.ReportError("validate", fmt.Sprintf("unsupported schema %T", s))
	}
}

// skipSized skips a string's or bytes' length and content.
func (c *avroChecker) skipSized(what string) {
	r := c.r
	n := r.ReadLong()
	switch {
	case r.Error != nil:
	case n < 0:
		r.ReportError("validate", fmt.Sprintf("negative %s length %d", what, n))
	case n > 0:
		r.SkipNBytes(int(n))
	}
}

// blocks reads the blocks of an array or a map, calling item for each of
// their items.
func (c *avroChecker) blocks(item func()) {
	r := c.r
	for r.Error == nil {
		n, _ := r.ReadBlockHeader()
		switch {
		case r.Error != nil:
			return
		case n == 0:
			return
		case n < 0 || n > c.items:
			r.ReportError("validate", fmt.Sprintf("a block of %d items does not fit in the record", n))
			return
		}
		c.items -= n
		for range n {
			if item(); r.Error != nil {
				return
			}
		}
	}
}

package schema

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxProtoDepth is the nesting limit of checkProto, protobuf-go's default
// recursion limit.
const maxProtoDepth = 10000

// checkProto checks that b is a record of the message md as decoding it
// (proto.Unmarshal into a dynamicpb message) would, and that it holds no
// field md does not define, reading it in place with protowire's
// primitives and building nothing: every tag names a field of md with the
// wire type of its kind (or packed, for a repeated scalar), every length
// and varint ends within b, every string of a proto3 message is UTF-8,
// nested messages, groups and map entries likewise (an unknown field of a
// map entry is skipped, as the protobuf spec says).
func checkProto(md protoreflect.MessageDescriptor, b []byte, depth int) error {
	if depth > maxProtoDepth {
		return errors.New("nested deeper than the recursion limit")
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("in %s: %w", md.FullName(), protowire.ParseError(n))
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil && md.IsMapEntry() {
			// The protobuf spec has parsers skip unknown fields of a map
			// entry, and protobuf-go does: skip it, well-formed.
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("in %s: %w", md.FullName(), protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if fd == nil {
			return fmt.Errorf("%s holds fields the schema does not define (number %d)", md.FullName(), num)
		}
		n, err := checkField(fd, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// checkField checks one value of fd of wire type typ at the start of b and
// returns its length.
func checkField(fd protoreflect.FieldDescriptor, typ protowire.Type, b []byte, depth int) (int, error) {
	want := wireType(fd.Kind())
	if typ != want {
		if typ == protowire.BytesType && fd.IsList() && want != protowire.BytesType && want != protowire.StartGroupType {
			return checkPacked(fd, want, b)
		}
		return 0, fmt.Errorf("field %s (number %d) is a %v, the record has wire type %d", fd.FullName(), fd.Number(), fd.Kind(), typ)
	}
	switch typ {
	case protowire.StartGroupType:
		n := protowire.ConsumeFieldValue(fd.Number(), typ, b)
		if n < 0 {
			return 0, fmt.Errorf("field %s: %w", fd.FullName(), protowire.ParseError(n))
		}
		// The group's body is what lies before its end tag.
		end := n - protowire.SizeTag(fd.Number())
		return n, checkProto(fd.Message(), b[:end], depth+1)
	case protowire.BytesType:
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, fmt.Errorf("field %s: %w", fd.FullName(), protowire.ParseError(n))
		}
		switch {
		case fd.Message() != nil:
			return n, checkProto(fd.Message(), v, depth+1)
		case fd.Kind() == protoreflect.StringKind && enforcesUTF8(fd) && !utf8.Valid(v):
			return 0, fmt.Errorf("field %s is not valid UTF-8", fd.FullName())
		}
		return n, nil
	}
	n := protowire.ConsumeFieldValue(fd.Number(), typ, b)
	if n < 0 {
		return 0, fmt.Errorf("field %s: %w", fd.FullName(), protowire.ParseError(n))
	}
	return n, nil
}

// checkPacked checks a packed repeated scalar: a length, then values of
// wire type want filling it exactly.
func checkPacked(fd protoreflect.FieldDescriptor, want protowire.Type, b []byte) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, fmt.Errorf("field %s: %w", fd.FullName(), protowire.ParseError(n))
	}
	for len(v) > 0 {
		m := protowire.ConsumeFieldValue(fd.Number(), want, v)
		if m < 0 {
			return 0, fmt.Errorf("packed field %s: %w", fd.FullName(), protowire.ParseError(m))
		}
		v = v[m:]
	}
	return n, nil
}

// wireType is the wire type of a field of kind k.
func wireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.VarintType
}

// enforcesUTF8 reports a string field whose value must be UTF-8, as
// protobuf-go decides it: proto3 syntax (editions' utf8_validation
// feature is not read here: such files are checked as proto3).
func enforcesUTF8(fd protoreflect.FieldDescriptor) bool {
	return fd.ParentFile() != nil && fd.ParentFile().Syntax() != protoreflect.Proto2
}

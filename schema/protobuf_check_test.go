package schema

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// everyProtoKind is a schema with a field of every kind: scalars, packed
// and unpacked repeated scalars, strings, bytes, an enum, a nested and a
// recursive message, a map of messages, a proto2 group.
const everyProtoKind = `syntax = "proto2";
package t;
message Every {
  optional int32 i32 = 1;
  optional int64 i64 = 2;
  optional uint32 u32 = 3;
  optional uint64 u64 = 4;
  optional sint32 s32 = 5;
  optional sint64 s64 = 6;
  optional bool b = 7;
  optional fixed32 f32 = 8;
  optional fixed64 f64 = 9;
  optional sfixed32 sf32 = 10;
  optional sfixed64 sf64 = 11;
  optional float fl = 12;
  optional double d = 13;
  optional string s = 14;
  optional bytes by = 15;
  optional Color c = 16;
  repeated int32 packed = 17 [packed = true];
  repeated fixed64 unpacked = 18;
  optional Every next = 19;
  map<string, Inner> inners = 20;
  optional group G = 21 { optional int32 gv = 22; }
  enum Color { RED = 0; GREEN = 1; }
  message Inner { optional string v = 1; repeated double ds = 2 [packed = true]; }
}
`

// everyProto3 is proto3, where strings must be UTF-8.
const everyProto3 = `syntax = "proto3";
package t3;
message Doc { string title = 1; repeated string tags = 2; map<string, string> attrs = 3; Doc child = 4; }
`

// decodesProto is the oracle: the record unmarshals into a dynamicpb
// message of md and holds no field md lacks.
func decodesProto(md protoreflect.MessageDescriptor, b []byte) bool {
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, m); err != nil {
		return false
	}
	return !hasUnknown(m)
}

func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					found = hasUnknown(mv.Message())
					return !found
				})
			}
		case fd.Message() == nil:
		case fd.IsList():
			for i := 0; i < v.List().Len() && !found; i++ {
				found = hasUnknown(v.List().Get(i).Message())
			}
		default:
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}

func everyProtoRecord(t *testing.T) (protoreflect.MessageDescriptor, []byte) {
	t.Helper()
	c, err := compileProtobuf(everyProtoKind, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	md := c.desc
	m := dynamicpb.NewMessage(md)
	f := md.Fields().ByName
	m.Set(f("i32"), protoreflect.ValueOfInt32(-5))
	m.Set(f("i64"), protoreflect.ValueOfInt64(1<<40))
	m.Set(f("u32"), protoreflect.ValueOfUint32(7))
	m.Set(f("u64"), protoreflect.ValueOfUint64(1<<50))
	m.Set(f("s32"), protoreflect.ValueOfInt32(-9))
	m.Set(f("s64"), protoreflect.ValueOfInt64(-1<<33))
	m.Set(f("b"), protoreflect.ValueOfBool(true))
	m.Set(f("f32"), protoreflect.ValueOfUint32(3))
	m.Set(f("f64"), protoreflect.ValueOfUint64(4))
	m.Set(f("sf32"), protoreflect.ValueOfInt32(-3))
	m.Set(f("sf64"), protoreflect.ValueOfInt64(-4))
	m.Set(f("fl"), protoreflect.ValueOfFloat32(1.5))
	m.Set(f("d"), protoreflect.ValueOfFloat64(2.5))
	m.Set(f("s"), protoreflect.ValueOfString("héllo"))
	m.Set(f("by"), protoreflect.ValueOfBytes([]byte{0, 255}))
	m.Set(f("c"), protoreflect.ValueOfEnum(1))
	for _, v := range []int32{1, -2, 300} {
		m.Mutable(f("packed")).List().Append(protoreflect.ValueOfInt32(v))
	}
	m.Mutable(f("unpacked")).List().Append(protoreflect.ValueOfUint64(9))
	next := m.Mutable(f("next")).Message()
	next.Set(f("s"), protoreflect.ValueOfString("inner"))
	inner := m.Mutable(f("inners")).Map().NewValue()
	inner.Message().Set(inner.Message().Descriptor().Fields().ByName("v"), protoreflect.ValueOfString("x"))
	inner.Message().Mutable(inner.Message().Descriptor().Fields().ByName("ds")).List().Append(protoreflect.ValueOfFloat64(0.5))
	m.Mutable(f("inners")).Map().Set(protoreflect.ValueOfString("k").MapKey(), inner)
	g := m.Mutable(f("g")).Message()
	g.Set(g.Descriptor().Fields().ByName("gv"), protoreflect.ValueOfInt32(12))
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return md, b
}

// The check agrees with decoding on a record of every kind, on each of its
// truncations, and on every one-byte change of it to several values.
func TestProtobufCheckAgreesWithDecoding(t *testing.T) {
	md, good := everyProtoRecord(t)
	if err := checkProto(md, good, 0); err != nil || !decodesProto(md, good) {
		t.Fatalf("the record: check %v, decodes %v", err, decodesProto(md, good))
	}
	agree := func(what string, b []byte) {
		t.Helper()
		err := checkProto(md, b, 0)
		if (err == nil) != decodesProto(md, b) {
			t.Errorf("%s (%x): check says %v, decoding says %v", what, b, err, decodesProto(md, b))
		}
	}
	for i := range len(good) {
		agree(fmt.Sprintf("truncated to %d", i), good[:i])
	}
	for i := range good {
		for _, v := range []byte{0x00, 0x01, 0x07, 0x08, 0x0a, 0x0b, 0x0c, 0x7f, 0x80, 0xff, good[i] ^ 0x01, good[i] ^ 0x80} {
			b := append([]byte{}, good...)
			b[i] = v
			agree(fmt.Sprintf("byte %d set to %#x", i, v), b)
		}
	}
}

// Proto3 strings must be UTF-8, at any depth, map keys and values too.
func TestProtobufCheckRefusesInvalidUTF8InProto3(t *testing.T) {
	c, err := compileProtobuf(everyProto3, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(c.desc)
	f := c.desc.Fields().ByName
	m.Set(f("title"), protoreflect.ValueOfString("ok"))
	m.Mutable(f("tags")).List().Append(protoreflect.ValueOfString("tag"))
	m.Mutable(f("attrs")).Map().Set(protoreflect.ValueOfString("key").MapKey(), protoreflect.ValueOfString("val"))
	m.Mutable(f("child")).Message().Set(f("title"), protoreflect.ValueOfString("kid"))
	good, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkProto(c.desc, good, 0); err != nil {
		t.Fatal(err)
	}
	for _, word := range []string{"ok", "tag", "key", "val", "kid"} {
		i := bytesIndex(t, good, word)
		b := append([]byte{}, good...)
		b[i] = 0xff
		if err := checkProto(c.desc, b, 0); err == nil || decodesProto(c.desc, b) {
			t.Errorf("%q made invalid UTF-8: check %v, decodes %v", word, err, decodesProto(c.desc, b))
		}
	}
}

func bytesIndex(t *testing.T, b []byte, word string) int {
	t.Helper()
	for i := 0; i+len(word) <= len(b); i++ {
		if string(b[i:i+len(word)]) == word {
			return i
		}
	}
	t.Fatalf("%q not in the record", word)
	return 0
}

// The check builds nothing.
func TestProtobufCheckDoesNotAllocate(t *testing.T) {
	md, good := everyProtoRecord(t)
	if n := testing.AllocsPerRun(100, func() { _ = checkProto(md, good, 0) }); n != 0 {
		t.Errorf("%v allocations per check", n)
	}
}

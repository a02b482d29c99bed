package schematest

import (
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Protobuf compatibility, a documented subset of Confluent's rules, on the
// messages of the schema's own file (not of its imports):
//
//   - a message of the writer schema that the reader schema lacks (by full
//     name, nested messages included) is incompatible (MESSAGE_REMOVED);
//   - a field number present in both whose type changed between wire
//     kinds that do not read each other is incompatible
//     (FIELD_KIND_CHANGED). Kinds read each other within a group:
//     {int32, uint32, int64, uint64, bool}, {sint32, sint64},
//     {fixed32, sfixed32}, {fixed64, sfixed64}, {string, bytes}; an enum
//     reads an enum of the same full name only;
//   - a message-typed field whose message changed to another full name is
//     incompatible (FIELD_NAMED_TYPE_CHANGED), and so is an enum field's
//     enum; a map field's key and value follow the rules of a field.
//
// Not checked: labels (repeated, optional), oneofs, field names (the wire
// has numbers only), reserved numbers.
//
// As Confluent does, FORWARD checks the same rules with the roles swapped,
// so a message added by the new schema is incompatible for FORWARD.

// protoIncompatibilities lists why reader cannot read what writer writes.
func protoIncompatibilities(reader, writer protoreflect.FileDescriptor, readerRole, writerRole string) []problem {
	readerMsgs := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	eachMessage(reader.Messages(), func(m protoreflect.MessageDescriptor) { readerMsgs[m.FullName()] = m })
	var out []problem
	eachMessage(writer.Messages(), func(wm protoreflect.MessageDescriptor) {
		if wm.IsMapEntry() {
			return // a map field's entry: the field's own rules cover it
		}
		rm, ok := readerMsgs[wm.FullName()]
		if !ok {
			out = append(out, problem{"MESSAGE_REMOVED",
				fmt.Sprintf("message %s of the %s schema is missing in the %s schema", wm.FullName(), writerRole, readerRole)})
			return
		}
		wfields := wm.Fields()
		for i := range wfields.Len() {
			wf := wfields.Get(i)
			rf := rm.Fields().ByNumber(wf.Number())
			if rf == nil {
				continue // an unknown field: the reader skips it
			}
			if kind, why := protoFieldChange(rf, wf, readerRole, writerRole); kind != "" {
				out = append(out, problem{kind, fmt.Sprintf("message %s: field %s (number %d) %s", wm.FullName(), rf.Name(), wf.Number(), why)})
			}
		}
	})
	return out
}

// eachMessage calls fn on every message of ms and their nested messages.
func eachMessage(ms protoreflect.MessageDescriptors, fn func(protoreflect.MessageDescriptor)) {
	for i := range ms.Len() {
		m := ms.Get(i)
		fn(m)
		eachMessage(m.Messages(), fn)
	}
}

// protoFieldChange says whether reader's field rf reads writer's field wf
// (of the same number): "" when it does, else Confluent's errorType and
// why.
func protoFieldChange(rf, wf protoreflect.FieldDescriptor, readerRole, writerRole string) (kind, why string) {
	if rf.IsMap() && wf.IsMap() {
		if kind, why := protoFieldChange(rf.MapKey(), wf.MapKey(), readerRole, writerRole); kind != "" {
			return kind, "(its map key) " + why
		}
		if kind, why := protoFieldChange(rf.MapValue(), wf.MapValue(), readerRole, writerRole); kind != "" {
			return kind, "(its map value) " + why
		}
		return "", ""
	}
	rk, wk := rf.Kind(), wf.Kind()
	switch {
	case protoKindGroup(rk) != protoKindGroup(wk):
		return "FIELD_KIND_CHANGED", fmt.Sprintf("is %s in the %s schema and %s in the %s schema: those wire types do not read each other", protoTypeName(wf), writerRole, protoTypeName(rf), readerRole)
	case (rk == protoreflect.MessageKind || rk == protoreflect.GroupKind) && rf.Message().FullName() != wf.Message().FullName():
		return "FIELD_NAMED_TYPE_CHANGED", fmt.Sprintf("is %s in the %s schema and %s in the %s schema", wf.Message().FullName(), writerRole, rf.Message().FullName(), readerRole)
	case rk == protoreflect.EnumKind && rf.Enum().FullName() != wf.Enum().FullName():
		return "FIELD_NAMED_TYPE_CHANGED", fmt.Sprintf("is %s in the %s schema and %s in the %s schema", wf.Enum().FullName(), writerRole, rf.Enum().FullName(), readerRole)
	}
	return "", ""
}

// protoKindGroup is the group of kinds that read each other's wire
// encoding.
func protoKindGroup(k protoreflect.Kind) string {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.BoolKind:
		return "varint"
	case protoreflect.Sint32Kind, protoreflect.Sint64Kind:
		return "zigzag"
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind:
		return "fixed32"
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return "fixed64"
	case protoreflect.StringKind, protoreflect.BytesKind:
		return "length-delimited"
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return "message"
	}
	return k.String() // float, double, enum: each alone
}

// protoTypeName is a field's type as a .proto file spells it.
func protoTypeName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return string(f.Message().FullName())
	case protoreflect.EnumKind:
		return string(f.Enum().FullName())
	}
	return f.Kind().String()
}

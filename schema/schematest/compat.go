package schematest

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/sr"
)

// problem is one incompatibility between a reader schema and a writer
// schema: kind is Confluent's errorType (READER_FIELD_MISSING_DEFAULT_VALUE,
// TYPE_MISMATCH, ...), detail names the field or message and what broke.
type problem struct {
	kind   string
	detail string
}

// checkResult is the answer to a compatibility check: messages are
// Confluent's verbose messages (why, which old version, which level),
// empty when compatible.
type checkResult struct {
	compatible bool
	messages   []string
}

// readsBackward and readsForward tell which direction a level checks:
// BACKWARD, the new schema reads what the old one wrote; FORWARD, the old
// schema reads what the new one writes; FULL, both.
func readsBackward(l sr.CompatibilityLevel) bool {
	return l == sr.CompatBackward || l == sr.CompatBackwardTransitive || l == sr.CompatFull || l == sr.CompatFullTransitive
}

func readsForward(l sr.CompatibilityLevel) bool {
	return l == sr.CompatForward || l == sr.CompatForwardTransitive || l == sr.CompatFull || l == sr.CompatFullTransitive
}

func transitive(l sr.CompatibilityLevel) bool {
	return l == sr.CompatBackwardTransitive || l == sr.CompatForwardTransitive || l == sr.CompatFullTransitive
}

// check checks schema sch (parsed as p) of subject name against olds, the
// subject's live versions, oldest first, in the direction level asks:
// with byLevel, against the latest only unless the level is transitive
// (registration, and the check against "all versions"); without, against
// each of olds (the check against one named version). It stops at the
// newest incompatible version, as Confluent does. st.mu is held.
func (st *store) check(name string, sch sr.Schema, p *parsed, olds []*version, level sr.CompatibilityLevel, byLevel bool) checkResult {
	if level == sr.CompatNone || len(olds) == 0 {
		return checkResult{compatible: true, messages: []string{}}
	}
	if byLevel && !transitive(level) {
		olds = olds[len(olds)-1:]
	}
	for _, old := range slices.Backward(olds) {
		oldSchema := st.byID[old.id].schema
		var probs []problem
		op, aerr := st.parse(oldSchema)
		switch {
		case aerr != nil:
			probs = []problem{{"OLD_SCHEMA_UNREADABLE", fmt.Sprintf("version %d of subject %q no longer parses: %s", old.number, name, aerr.msg)}}
		case op.typ != p.typ:
			probs = []problem{{"SCHEMA_TYPE_CHANGED", fmt.Sprintf("the schema type changed from %s (old) to %s (new)", oldSchema.Type, sch.Type)}}
		default:
			if readsBackward(level) {
				probs = append(probs, incompatibilities(p, op, "new", "old")...)
			}
			if readsForward(level) {
				probs = append(probs, incompatibilities(op, p, "old", "new")...)
			}
		}
		if len(probs) == 0 {
			continue
		}
		msgs := make([]string, 0, len(probs)+2)
		for _, pr := range probs {
			msgs = append(msgs, fmt.Sprintf("{errorType:'%s', description:'%s'}", pr.kind, pr.detail))
		}
		msgs = append(msgs, fmt.Sprintf("{oldSchemaVersion: %d}", old.number), fmt.Sprintf("{compatibility: '%s'}", level))
		return checkResult{compatible: false, messages: msgs}
	}
	return checkResult{compatible: true, messages: []string{}}
}

// incompatibilities lists why reader cannot read what writer writes (both
// of one type). readerRole and writerRole ("new", "old") name them in the
// details.
func incompatibilities(reader, writer *parsed, readerRole, writerRole string) []problem {
	switch reader.typ {
	case sr.TypeAvro:
		return avroIncompatibilities(reader.avro, writer.avro, readerRole, writerRole)
	case sr.TypeProtobuf:
		return protoIncompatibilities(reader.proto, writer.proto, readerRole, writerRole)
	case sr.TypeJSON:
		return jsonIncompatibilities(reader.json, writer.json, readerRole, writerRole)
	}
	return nil
}

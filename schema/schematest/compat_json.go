package schematest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// JSON Schema compatibility, a documented subset of Confluent's rules,
// walking "properties" (and "items") of the schemas present in both,
// from the root:
//
//   - a "type" the reader does not cover is incompatible: every type the
//     writer allows must be one the reader allows ("number" covers
//     "integer"; no "type" allows everything). A type changed to another
//     is TYPE_CHANGED, a type list that lost members TYPE_NARROWED;
//   - a property the reader lists in "required" that the writer does not
//     is incompatible (REQUIRED_ATTRIBUTE_ADDED): for BACKWARD, a property
//     newly required by the new schema; for FORWARD, one the new schema no
//     longer requires.
//
// Not checked: "$ref" (not followed), combinators (allOf, anyOf, oneOf,
// not), "additionalProperties", "enum", "const", and value constraints
// (minimum, maxLength, pattern, ...).

// jsonIncompatibilities lists why reader cannot validate every document
// writer validates.
func jsonIncompatibilities(reader, writer any, readerRole, writerRole string) []problem {
	r, rok := reader.(map[string]any)
	w, wok := writer.(map[string]any)
	if !rok || !wok {
		return nil // a boolean schema: nothing this subset compares
	}
	j := jsonWalk{readerRole: readerRole, writerRole: writerRole}
	j.walk(r, w, "")
	return j.out
}

type jsonWalk struct {
	readerRole, writerRole string
	out                    []problem
}

func (j *jsonWalk) walk(r, w map[string]any, path string) {
	rt, wt := jsonTypes(r), jsonTypes(w)
	if !typesCover(rt, wt) {
		kind := "TYPE_NARROWED"
		if !typesOverlap(rt, wt) {
			kind = "TYPE_CHANGED"
		}
		j.out = append(j.out, problem{kind, fmt.Sprintf("%s has type %s in the %s schema and %s in the %s schema",
			jsonWhat(path), typesString(wt), j.writerRole, typesString(rt), j.readerRole)})
		return
	}
	wreq := jsonRequired(w)
	for _, name := range jsonRequired(r) {
		if !slices.Contains(wreq, name) {
			j.out = append(j.out, problem{"REQUIRED_ATTRIBUTE_ADDED", fmt.Sprintf("%s is required in the %s schema but not in the %s schema",
				jsonWhat(path+"/properties/"+name), j.readerRole, j.writerRole)})
		}
	}
	rp, _ := r["properties"].(map[string]any)
	wp, _ := w["properties"].(map[string]any)
	names := make([]string, 0, len(rp))
	for name := range rp {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		rs, rok := rp[name].(map[string]any)
		ws, wok := wp[name].(map[string]any)
		if rok && wok {
			j.walk(rs, ws, path+"/properties/"+name)
		}
	}
	ri, rok := r["items"].(map[string]any)
	wi, wok := w["items"].(map[string]any)
	if rok && wok {
		j.walk(ri, wi, path+"/items")
	}
}

// jsonWhat describes the schema at path: the property it is, or the root.
func jsonWhat(path string) string {
	if path == "" {
		return "the schema (path /)"
	}
	i := strings.LastIndex(path, "/")
	if name := path[i+1:]; strings.HasSuffix(path[:i], "/properties") {
		return fmt.Sprintf("property %s (path %s)", name, path)
	}
	return fmt.Sprintf("the schema at path %s", path)
}

// jsonTypes is the set of types a schema's "type" allows; nil when it has
// no "type" (every type).
func jsonTypes(s map[string]any) []string {
	switch t := s["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, v := range t {
			if str, ok := v.(string); ok {
				out = append(out, str)
			}
		}
		sort.Strings(out)
		return out
	}
	return nil
}

// typesCover says whether a reader allowing types r accepts every value a
// writer allowing types w produces.
func typesCover(r, w []string) bool {
	if r == nil {
		return true
	}
	if w == nil {
		return false
	}
	for _, t := range w {
		if !slices.Contains(r, t) && (t != "integer" || !slices.Contains(r, "number")) {
			return false
		}
	}
	return true
}

func typesOverlap(r, w []string) bool {
	if r == nil || w == nil {
		return true
	}
	for _, t := range w {
		if slices.Contains(r, t) || (t == "integer" && slices.Contains(r, "number")) || (t == "number" && slices.Contains(r, "integer")) {
			return true
		}
	}
	return false
}

func typesString(ts []string) string {
	switch len(ts) {
	case 0:
		return "(any)"
	case 1:
		return fmt.Sprintf("%q", ts[0])
	}
	return fmt.Sprintf("%q", ts)
}

// jsonRequired is a schema's "required" list.
func jsonRequired(s map[string]any) []string {
	list, _ := s["required"].([]any)
	var out []string
	for _, v := range list {
		if str, ok := v.(string); ok {
			out = append(out, str)
		}
	}
	return out
}

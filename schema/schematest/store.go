package schematest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/sr"
)

// apiError is an error the REST surface answers with: an HTTP status and
// a Confluent error body {"error_code":code,"message":msg}.
type apiError struct {
	status int
	code   int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errSubjectNotFound(subject string) *apiError {
	return &apiError{http.StatusNotFound, sr.ErrSubjectNotFound.Code, fmt.Sprintf("Subject '%s' not found.", subject)}
}

func errVersionNotFound(subject string, version int) *apiError {
	return &apiError{http.StatusNotFound, sr.ErrVersionNotFound.Code, fmt.Sprintf("Version %d not found for subject '%s'.", version, subject)}
}

func errSchemaNotFound() *apiError {
	return &apiError{http.StatusNotFound, sr.ErrSchemaNotFound.Code, "Schema not found"}
}

func errInvalidSchema(format string, args ...any) *apiError {
	return &apiError{http.StatusUnprocessableEntity, sr.ErrInvalidSchema.Code, fmt.Sprintf(format, args...)}
}

// storedSchema is a schema under its global id.
type storedSchema struct {
	id     int
	schema sr.Schema // as first registered
}

// version is one version of a subject.
type version struct {
	number  int
	id      int
	deleted bool // soft-deleted
}

// subject is a subject's versions, oldest first, and its compatibility
// level when one was set for it.
type subject struct {
	versions []*version
	compat   sr.CompatibilityLevel // 0: none set, the global level applies
}

// live returns the versions that are not soft-deleted, oldest first.
func (s *subject) live() []*version {
	var out []*version
	for _, v := range s.versions {
		if !v.deleted {
			out = append(out, v)
		}
	}
	return out
}

// find returns version n (soft-deleted ones too when deleted is true).
func (s *subject) find(n int, deleted bool) *version {
	for _, v := range s.versions {
		if v.number == n && (deleted || !v.deleted) {
			return v
		}
	}
	return nil
}

// store is the registry's state. Every operation holds mu throughout, so
// that a registration's compatibility check and its write are one step.
type store struct {
	mu       sync.Mutex
	byID     map[int]*storedSchema
	byKey    map[string]int // schemaKey -> id: the same schema gets the same id under every subject
	nextID   int
	subjects map[string]*subject
	global   sr.CompatibilityLevel
}

func newStore() *store {
	return &store{
		byID:     map[int]*storedSchema{},
		byKey:    map[string]int{},
		nextID:   1,
		subjects: map[string]*subject{},
		global:   sr.CompatBackward,
	}
}

// schemaKey identifies a schema for id sharing and idempotent
// registration: its type, its text with insignificant differences
// removed (JSON whitespace and key order for Avro and JSON Schema,
// surrounding space for Protobuf) and its references.
func schemaKey(s sr.Schema) string {
	text := strings.TrimSpace(s.Schema)
	if s.Type == sr.TypeAvro || s.Type == sr.TypeJSON {
		dec := json.NewDecoder(strings.NewReader(text))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil {
			if b, err := json.Marshal(v); err == nil {
				text = string(b)
			}
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d\x00%s", s.Type, text)
	for _, r := range s.References {
		fmt.Fprintf(&b, "\x00%s\x00%s\x00%d", r.Name, r.Subject, r.Version)
	}
	return b.String()
}

// liveSubject returns the subject if it has versions that are not
// soft-deleted (deleted: or any versions at all).
func (st *store) liveSubject(name string, deleted bool) (*subject, *apiError) {
	s := st.subjects[name]
	if s == nil || len(s.versions) == 0 || (!deleted && len(s.live()) == 0) {
		return nil, errSubjectNotFound(name)
	}
	return s, nil
}

// resolveVersion returns the version of subject named by "latest", "-1"
// or a number.
func (st *store) resolveVersion(name, ver string, deleted bool) (*version, *apiError) {
	s, aerr := st.liveSubject(name, deleted)
	if aerr != nil {
		return nil, aerr
	}
	if ver == "latest" || ver == "-1" {
		vs := s.versions
		if !deleted {
			vs = s.live()
		}
		return vs[len(vs)-1], nil
	}
	n, err := parseVersion(ver)
	if err != nil {
		return nil, err
	}
	v := s.find(n, deleted)
	if v == nil {
		return nil, errVersionNotFound(name, n)
	}
	return v, nil
}

// subjectSchema is version v of subject name as the REST surface shows it.
func (st *store) subjectSchema(name string, v *version) sr.SubjectSchema {
	return sr.SubjectSchema{Subject: name, Version: v.number, ID: v.id, Schema: st.byID[v.id].schema}
}

// level is the compatibility level that applies to subject name.
func (st *store) level(name string) sr.CompatibilityLevel {
	if s := st.subjects[name]; s != nil && s.compat != 0 {
		return s.compat
	}
	return st.global
}

// register registers sch under subject name (POST
// /subjects/{name}/versions) and returns its id: the id of the same schema
// already registered under the subject, or else, after the compatibility
// check the subject's level asks for, a new version with the id the
// schema has under another subject or a new id.
func (st *store) register(name string, sch sr.Schema, wantID, wantVersion int) (int, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if aerr := validSubject(name); aerr != nil {
		return 0, aerr
	}
	parsed, aerr := st.parse(sch)
	if aerr != nil {
		return 0, aerr
	}
	key := schemaKey(sch)
	s := st.subjects[name]
	if s == nil {
		s = &subject{} // stored below, once a version is
	}
	for _, v := range s.live() {
		if schemaKey(st.byID[v.id].schema) == key {
			return v.id, nil
		}
	}
	id, known := st.byKey[key]
	if (wantID > 0 && (!known || wantID != id)) || (wantVersion > 0 && wantVersion != nextVersion(s)) {
		return 0, &apiError{http.StatusUnprocessableEntity, sr.ErrOperationNotPermitted.Code,
			fmt.Sprintf("Registering with a chosen id (%d) or version (%d) needs IMPORT mode, which the stand-in does not have: register without them", wantID, wantVersion)}
	}
	if res := st.check(name, sch, parsed, s.live(), st.level(name), true); !res.compatible {
		return 0, &apiError{http.StatusConflict, sr.ErrIncompatibleSchema.Code,
			fmt.Sprintf("Schema being registered is incompatible with an earlier schema for subject %q, details: [%s]", name, strings.Join(res.messages, ", "))}
	}
	if !known {
		id = st.nextID
		st.nextID++
		st.byKey[key] = id
		st.byID[id] = &storedSchema{id: id, schema: sch}
	}
	s.versions = append(s.versions, &version{number: nextVersion(s), id: id})
	st.subjects[name] = s
	return id, nil
}

// nextVersion is the number the subject's next version gets: one more
// than its highest, soft-deleted versions included.
func nextVersion(s *subject) int {
	if len(s.versions) == 0 {
		return 1
	}
	return s.versions[len(s.versions)-1].number + 1
}

func validSubject(name string) *apiError {
	if name == "" || strings.ContainsRune(name, 0) {
		return &apiError{http.StatusUnprocessableEntity, sr.ErrInvalidSubject.Code, fmt.Sprintf("Invalid subject %q", name)}
	}
	return nil
}

// lookup finds sch among the versions of subject name (POST
// /subjects/{name}).
func (st *store) lookup(name string, sch sr.Schema, deleted bool) (sr.SubjectSchema, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, aerr := st.liveSubject(name, deleted)
	if aerr != nil {
		return sr.SubjectSchema{}, aerr
	}
	if _, aerr := st.parse(sch); aerr != nil {
		return sr.SubjectSchema{}, aerr
	}
	key := schemaKey(sch)
	for _, v := range slices.Backward(s.versions) {
		if (deleted || !v.deleted) && schemaKey(st.byID[v.id].schema) == key {
			return st.subjectSchema(name, v), nil
		}
	}
	return sr.SubjectSchema{}, errSchemaNotFound()
}

// compatibility checks sch against version ver of subject name, or, for
// ver "", against the versions the subject's level names (POST
// /compatibility/subjects/{name}/versions[/{ver}]).
func (st *store) compatibility(name, ver string, sch sr.Schema) (checkResult, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	parsed, aerr := st.parse(sch)
	if aerr != nil {
		return checkResult{}, aerr
	}
	if ver == "" {
		var live []*version
		if s := st.subjects[name]; s != nil {
			live = s.live()
		}
		return st.check(name, sch, parsed, live, st.level(name), true), nil
	}
	v, aerr := st.resolveVersion(name, ver, false)
	if aerr != nil {
		return checkResult{}, aerr
	}
	return st.check(name, sch, parsed, []*version{v}, st.level(name), false), nil
}

// deleteSubject soft-deletes subject name, or, permanent, removes its
// soft-deleted versions (DELETE /subjects/{name}), and returns the
// versions it deleted.
func (st *store) deleteSubject(name string, permanent bool) ([]int, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, aerr := st.liveSubject(name, true)
	if aerr != nil {
		return nil, aerr
	}
	if !permanent && len(s.live()) == 0 {
		return nil, &apiError{http.StatusNotFound, sr.ErrSubjectSoftDeleted.Code,
			fmt.Sprintf("Subject '%s' was soft deleted. Set permanent=true to delete permanently", name)}
	}
	if aerr := st.referenced(name, 0); aerr != nil {
		return nil, aerr
	}
	deleted := []int{}
	if permanent {
		if len(s.live()) > 0 {
			return nil, &apiError{http.StatusNotFound, sr.ErrSubjectNotSoftDeleted.Code,
				fmt.Sprintf("Subject '%s' was not deleted first before being permanently deleted", name)}
		}
		for _, v := range s.versions {
			deleted = append(deleted, v.number)
		}
		delete(st.subjects, name)
		return deleted, nil
	}
	for _, v := range s.live() {
		v.deleted = true
		deleted = append(deleted, v.number)
	}
	return deleted, nil
}

// deleteVersion soft-deletes version ver of subject name, or, permanent,
// removes it once soft-deleted (DELETE /subjects/{name}/versions/{ver}).
func (st *store) deleteVersion(name, ver string, permanent bool) (int, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	v, aerr := st.resolveVersion(name, ver, permanent)
	if aerr != nil {
		return 0, aerr
	}
	if aerr := st.referenced(name, v.number); aerr != nil {
		return 0, aerr
	}
	if !permanent {
		v.deleted = true
		return v.number, nil
	}
	if !v.deleted {
		return 0, &apiError{http.StatusNotFound, sr.ErrSchemaVersionNotSoftDeleted.Code,
			fmt.Sprintf("Subject '%s' Version %d was not deleted first before being permanently deleted", name, v.number)}
	}
	s := st.subjects[name]
	s.versions = slices.DeleteFunc(s.versions, func(x *version) bool { return x == v })
	if len(s.versions) == 0 {
		delete(st.subjects, name)
	}
	return v.number, nil
}

// referenced fails if a live schema references version n (0: any
// version) of subject name.
func (st *store) referenced(name string, n int) *apiError {
	for other, s := range st.subjects {
		for _, v := range s.live() {
			for _, r := range st.byID[v.id].schema.References {
				if r.Subject == name && (n == 0 || r.Version == n) {
					return &apiError{http.StatusUnprocessableEntity, sr.ErrReferenceExists.Code,
						fmt.Sprintf("One or more references exist to the schema {subject=%s,version=%d}: %s version %d references it", name, r.Version, other, v.number)}
				}
			}
		}
	}
	return nil
}

// schemaByID returns the schema of id and the subject versions that have
// it (soft-deleted ones too when deleted is true). An id is found while a
// version of some subject, soft-deleted or not, has it.
func (st *store) schemaByID(id int, deleted bool) (sr.Schema, []sr.SubjectVersion, *apiError) {
	st.mu.Lock()
	defer st.mu.Unlock()
	found := false
	uses := []sr.SubjectVersion{}
	for name, s := range st.subjects {
		for _, v := range s.versions {
			if v.id != id {
				continue
			}
			found = true
			if deleted || !v.deleted {
				uses = append(uses, sr.SubjectVersion{Subject: name, Version: v.number})
			}
		}
	}
	ss := st.byID[id]
	if ss == nil || !found {
		return sr.Schema{}, nil, errSchemaNotFound()
	}
	slices.SortFunc(uses, func(a, b sr.SubjectVersion) int {
		if c := strings.Compare(a.Subject, b.Subject); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return ss.schema, uses, nil
}

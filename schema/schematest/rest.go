package schematest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/sr"
)

// maxBody bounds a request body (a schema with its metadata).
const maxBody = 4 << 20

// routes is the REST surface over st, the Confluent subset franz-go's
// sr.Client uses; every request it serves adds one to requests.
func (st *store) routes(requests *atomic.Int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /subjects", st.getSubjects)
	mux.HandleFunc("GET /subjects/{subject}/versions", st.getVersions)
	mux.HandleFunc("POST /subjects/{subject}/versions", st.postVersion)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}", st.getVersion)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}/schema", st.getVersionText)
	mux.HandleFunc("DELETE /subjects/{subject}/versions/{version}", st.deleteVersionHandler)
	mux.HandleFunc("POST /subjects/{subject}", st.postLookup)
	mux.HandleFunc("DELETE /subjects/{subject}", st.deleteSubjectHandler)
	mux.HandleFunc("GET /schemas/types", func(w http.ResponseWriter, _ *http.Request) {
		respond(w, []string{"JSON", "PROTOBUF", "AVRO"})
	})
	mux.HandleFunc("GET /schemas/ids/{id}", st.getByID)
	mux.HandleFunc("GET /schemas/ids/{id}/schema", st.getByID)
	mux.HandleFunc("GET /schemas/ids/{id}/subjects", st.getByID)
	mux.HandleFunc("GET /schemas/ids/{id}/versions", st.getByID)
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions", st.postCompatibility)
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions/{version}", st.postCompatibility)
	mux.HandleFunc("GET /config", st.getConfig)
	mux.HandleFunc("PUT /config", st.putConfig)
	mux.HandleFunc("GET /config/{subject}", st.getConfig)
	mux.HandleFunc("PUT /config/{subject}", st.putConfig)
	mux.HandleFunc("DELETE /config/{subject}", st.deleteConfig)
	mux.HandleFunc("GET /mode", readWrite)
	mux.HandleFunc("GET /mode/{subject}", readWrite)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{http.StatusNotFound, http.StatusNotFound, fmt.Sprintf("HTTP 404 Not Found: the stand-in does not serve %s %s", r.Method, r.URL.Path)})
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		mux.ServeHTTP(w, r)
	})
}

func respond(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	_ = json.NewEncoder(w).Encode(body)
}

// respondText answers with a schema's own text (the .../schema endpoints).
func respondText(w http.ResponseWriter, text string) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	_, _ = io.WriteString(w, text)
}

// writeError answers with a Confluent error body, which sr.ResponseError
// parses.
func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"error_code"`
		Message string `json:"message"`
	}{e.code, e.msg})
}

// query flags of the GET and DELETE endpoints.
func deletedParam(r *http.Request) bool   { return r.URL.Query().Get("deleted") == "true" }
func permanentParam(r *http.Request) bool { return r.URL.Query().Get("permanent") == "true" }

func parseVersion(s string) (int, *apiError) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, &apiError{http.StatusUnprocessableEntity, sr.ErrInvalidVersion.Code,
			fmt.Sprintf("The specified version '%s' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"", s)}
	}
	return n, nil
}

// schemaBody is the body of the POST endpoints that carry a schema.
type schemaBody struct {
	Schema     string               `json:"schema"`
	SchemaType string               `json:"schemaType"`
	References []sr.SchemaReference `json:"references"`
	ID         int                  `json:"id"`
	Version    int                  `json:"version"`
}

// readSchema decodes a request's schema body.
func readSchema(w http.ResponseWriter, r *http.Request) (schemaBody, sr.Schema, *apiError) {
	var b schemaBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&b); err != nil {
		return b, sr.Schema{}, &apiError{http.StatusBadRequest, http.StatusBadRequest, fmt.Sprintf("The request body is not a schema: %v", err)}
	}
	sch := sr.Schema{Schema: b.Schema, References: b.References}
	switch strings.ToUpper(b.SchemaType) {
	case "", "AVRO":
		sch.Type = sr.TypeAvro
	case "PROTOBUF":
		sch.Type = sr.TypeProtobuf
	case "JSON":
		sch.Type = sr.TypeJSON
	default:
		return b, sr.Schema{}, errInvalidSchema("Invalid schema: unknown schema type %q (AVRO, PROTOBUF or JSON)", b.SchemaType)
	}
	return b, sch, nil
}

func (st *store) getSubjects(w http.ResponseWriter, r *http.Request) {
	deleted := deletedParam(r) || r.URL.Query().Get("deletedOnly") == "true"
	onlyDeleted := r.URL.Query().Get("deletedOnly") == "true"
	prefix := r.URL.Query().Get("subjectPrefix")
	st.mu.Lock()
	names := []string{}
	for name, s := range st.subjects {
		live := len(s.live()) > 0
		if len(s.versions) == 0 || !strings.HasPrefix(name, prefix) || (onlyDeleted && live) || (!deleted && !live) {
			continue
		}
		names = append(names, name)
	}
	st.mu.Unlock()
	sort.Strings(names)
	respond(w, names)
}

func (st *store) getVersions(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("subject")
	deleted := deletedParam(r)
	st.mu.Lock()
	s, aerr := st.liveSubject(name, deleted)
	versions := []int{}
	if aerr == nil {
		for _, v := range s.versions {
			if deleted || !v.deleted {
				versions = append(versions, v.number)
			}
		}
	}
	st.mu.Unlock()
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respond(w, versions)
}

func (st *store) postVersion(w http.ResponseWriter, r *http.Request) {
	b, sch, aerr := readSchema(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	id, aerr := st.register(r.PathValue("subject"), sch, b.ID, b.Version)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respond(w, map[string]int{"id": id})
}

// version looks up the version a request's path names.
func (st *store) version(r *http.Request) (sr.SubjectSchema, *apiError) {
	name := r.PathValue("subject")
	st.mu.Lock()
	defer st.mu.Unlock()
	v, aerr := st.resolveVersion(name, r.PathValue("version"), deletedParam(r))
	if aerr != nil {
		return sr.SubjectSchema{}, aerr
	}
	return st.subjectSchema(name, v), nil
}

func (st *store) getVersion(w http.ResponseWriter, r *http.Request) {
	ss, aerr := st.version(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respond(w, ss)
}

func (st *store) getVersionText(w http.ResponseWriter, r *http.Request) {
	ss, aerr := st.version(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respondText(w, ss.Schema.Schema)
}

func (st *store) postLookup(w http.ResponseWriter, r *http.Request) {
	_, sch, aerr := readSchema(w, r)
	if aerr == nil {
		var ss sr.SubjectSchema
		if ss, aerr = st.lookup(r.PathValue("subject"), sch, deletedParam(r)); aerr == nil {
			respond(w, ss)
			return
		}
	}
	writeError(w, aerr)
}

func (st *store) deleteSubjectHandler(w http.ResponseWriter, r *http.Request) {
	versions, aerr := st.deleteSubject(r.PathValue("subject"), permanentParam(r))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respond(w, versions)
}

func (st *store) deleteVersionHandler(w http.ResponseWriter, r *http.Request) {
	n, aerr := st.deleteVersion(r.PathValue("subject"), r.PathValue("version"), permanentParam(r))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	respond(w, n)
}

// getByID serves GET /schemas/ids/{id} and its /schema, /subjects and
// /versions.
func (st *store) getByID(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		writeError(w, errSchemaNotFound())
		return
	}
	sch, uses, aerr := st.schemaByID(id, deletedParam(r))
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/schema"):
		respondText(w, sch.Schema)
	case strings.HasSuffix(r.URL.Path, "/versions"):
		respond(w, uses)
	case strings.HasSuffix(r.URL.Path, "/subjects"):
		subjects := []string{}
		for _, u := range uses {
			if len(subjects) == 0 || subjects[len(subjects)-1] != u.Subject {
				subjects = append(subjects, u.Subject)
			}
		}
		respond(w, subjects)
	default:
		respond(w, sch)
	}
}

func (st *store) postCompatibility(w http.ResponseWriter, r *http.Request) {
	_, sch, aerr := readSchema(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	res, aerr := st.compatibility(r.PathValue("subject"), r.PathValue("version"), sch)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if r.URL.Query().Get("verbose") == "true" {
		respond(w, sr.CheckCompatibilityResult{Is: res.compatible, Messages: res.messages})
		return
	}
	respond(w, map[string]bool{"is_compatible": res.compatible})
}

// getConfig serves GET /config and GET /config/{subject}: a subject
// without a level of its own is 404 error 40408, unless
// defaultToGlobal=true asks for the global level.
func (st *store) getConfig(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("subject")
	st.mu.Lock()
	level := st.global
	if name != "" {
		level = 0
		if s := st.subjects[name]; s != nil {
			level = s.compat
		}
		if level == 0 && r.URL.Query().Get("defaultToGlobal") == "true" {
			level = st.global
		}
	}
	st.mu.Unlock()
	if level == 0 {
		writeError(w, &apiError{http.StatusNotFound, sr.ErrSubjectLevelCompatibilityNotConfigured.Code,
			fmt.Sprintf("Subject '%s' does not have subject-level compatibility configured", name)})
		return
	}
	respond(w, map[string]sr.CompatibilityLevel{"compatibilityLevel": level})
}

// putConfig serves PUT /config and PUT /config/{subject} (a subject need
// not exist to get a level).
func (st *store) putConfig(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Compatibility string `json:"compatibility"`
	}
	var level sr.CompatibilityLevel
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&body)
	if err == nil {
		err = level.UnmarshalText([]byte(body.Compatibility))
	}
	if err != nil {
		writeError(w, &apiError{http.StatusUnprocessableEntity, sr.ErrInvalidCompatibilityLevel.Code,
			fmt.Sprintf("Invalid compatibility level (%v). Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive", err)})
		return
	}
	name := r.PathValue("subject")
	st.mu.Lock()
	if name == "" {
		st.global = level
	} else if aerr := validSubject(name); aerr != nil {
		st.mu.Unlock()
		writeError(w, aerr)
		return
	} else {
		s := st.subjects[name]
		if s == nil {
			s = &subject{}
			st.subjects[name] = s
		}
		s.compat = level
	}
	st.mu.Unlock()
	respond(w, map[string]sr.CompatibilityLevel{"compatibility": level})
}

// deleteConfig serves DELETE /config/{subject}: the subject's level goes,
// the global one applies again.
func (st *store) deleteConfig(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("subject")
	st.mu.Lock()
	var old sr.CompatibilityLevel
	if s := st.subjects[name]; s != nil {
		old, s.compat = s.compat, 0
	}
	st.mu.Unlock()
	if old == 0 {
		writeError(w, &apiError{http.StatusNotFound, sr.ErrSubjectLevelCompatibilityNotConfigured.Code,
			fmt.Sprintf("Subject '%s' does not have subject-level compatibility configured", name)})
		return
	}
	respond(w, map[string]sr.CompatibilityLevel{"compatibility": old})
}

// readWrite serves GET /mode: the stand-in is always READWRITE.
func readWrite(w http.ResponseWriter, _ *http.Request) {
	respond(w, map[string]string{"mode": "READWRITE"})
}

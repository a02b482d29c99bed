package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Source is one database of a Sources console: a shard of a sharded
// application, as pipeline.Source names it for the Fleet that forwards it.
type Source struct {
	// Name names the source on the sources page and in its path,
	// /sources/<name>/: ASCII letters, digits, '.', '_' and '-' (the
	// rules of pipeline.Source), unique in the console. Required.
	Name string
	// Pool is the source's database. Required. The console does not close
	// it.
	Pool *pgxpool.Pool
	// Schema is the source's outbox schema (outbox.DefaultSchema when
	// empty).
	Schema string
}

// SourcesConfig configures a Sources console.
type SourcesConfig struct {
	// Sources are the databases shown, in this order. At least one.
	Sources []Source
	// Console is every source's console configuration: EnableActions,
	// Token, Authorize, Timeout, RefreshInterval, Prefix (where the
	// Sources console is mounted), AllowedHosts, the History settings and
	// Payloads.
	// Leave its Pool and Schema empty: each source's are its own. Its
	// Timeout also bounds the sources page: a source that has not answered
	// by then is shown unreachable.
	Console Config
}

// Validate reports the first impossible setting: no source, a source
// without a pool, a name that is invalid or given twice, a Pool or Schema
// in the template Console, or an impossible setting of the template (its
// field named "Console.<field>").
func (c SourcesConfig) Validate() error {
	if len(c.Sources) == 0 {
		return &outboxtype.ConfigError{Field: "Sources", Reason: "at least one source is required"}
	}
	if c.Console.Pool != nil {
		return &outboxtype.ConfigError{Field: "Console.Pool", Reason: "leave empty: each source's pool is its own (Sources[i].Pool)"}
	}
	if c.Console.Schema != "" {
		return &outboxtype.ConfigError{Field: "Console.Schema", Reason: "leave empty: each source's schema is its own (Sources[i].Schema)"}
	}
	seen := make(map[string]bool, len(c.Sources))
	for i, s := range c.Sources {
		if err := names.Source(s.Name); err != nil {
			return err
		}
		if seen[s.Name] {
			return &outboxtype.ConfigError{Field: fmt.Sprintf("Sources[%d].Name", i), Reason: fmt.Sprintf("source %s is named twice: names are unique", s.Name)}
		}
		seen[s.Name] = true
		if s.Pool == nil {
			return &outboxtype.ConfigError{Field: fmt.Sprintf("Sources[%d].Pool", i), Reason: fmt.Sprintf("required (source %s)", s.Name)}
		}
		if s.Schema != "" {
			if err := names.Schema(s.Schema); err != nil {
				return err
			}
		}
	}
	if err := c.sourceConfig(c.Sources[0]).Validate(); err != nil {
		if ce := (*outboxtype.ConfigError)(nil); errors.As(err, &ce) {
			return &outboxtype.ConfigError{Field: "Console." + ce.Field, Reason: ce.Reason}
		}
		return err
	}
	return nil
}

// sourceConfig is the configuration of s's own console: the template with
// s's pool and schema, mounted under /sources/<name>.
func (c SourcesConfig) sourceConfig(s Source) Config {
	cfg := c.Console
	cfg.Pool, cfg.Schema, cfg.Prefix = s.Pool, s.Schema, c.Console.Prefix+"/sources/"+s.Name
	return cfg
}

// Sources is the console of several databases; it is an http.Handler. At
// its root, the sources page shows every source side by side, one row each
// (admin.Summary: topics, partitions, pending, lag, max lag, leased,
// paused, failing, backing off, dead letters, and whether the source could
// be read), and a total over the sources that could be read, which says
// how many could not. /api/sources serves the same figures as JSON:
//
//	{"sources": [{"name": "eu", "schema": "outbox", "reachable": true, "summary": {"topics": 1, ...}},
//	             {"name": "us", "schema": "outbox", "reachable": false, "error": "..."}],
//	 "total": {"topics": 1, ...}, "reachable": 1, "unreachable": 1,
//	 "total_state": "INCOMPLETE: 1 of 2 sources unreachable, not counted: ..."}
//
// Each source's own console (New, with the source's Pool and Schema) is
// served under /sources/<name>/, with every page, API and action of a
// single console. Security is the single console's: the Host check of
// Config.AllowedHosts (421 otherwise), read-only pages, every value escaped.
type Sources struct {
	sources []mounted
	timeout time.Duration
	prefix  string
	schemas string // the sources' schemas, for the page's header
	actions bool
	logger  watermill.LoggerAdapter
	pages   map[string]*template.Template
	mux     *http.ServeMux
}

// mounted is one source and its console.
type mounted struct {
	name, schema string
	console      *Console
}

// NewSources creates a Sources console: one Console per source (New, with
// cfg.Console as template) and the sources page over them.
func NewSources(cfg SourcesConfig, logger watermill.LoggerAdapter) (*Sources, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	s := &Sources{timeout: cmp.Or(cfg.Console.Timeout, 10*time.Second), prefix: cfg.Console.Prefix, actions: cfg.Console.EnableActions,
		logger: logger, pages: map[string]*template.Template{}, mux: http.NewServeMux()}
	var schemas []string
	for _, src := range cfg.Sources {
		c, err := New(cfg.sourceConfig(src), logger.With(watermill.LogFields{"source": src.Name}))
		if err != nil {
			return nil, fmt.Errorf("console of source %s: %w", src.Name, err)
		}
		c.source, c.home = src.Name, cfg.Console.Prefix+"/"
		s.sources = append(s.sources, mounted{name: src.Name, schema: c.cfg.Schema, console: c})
		if !slices.Contains(schemas, c.cfg.Schema) {
			schemas = append(schemas, c.cfg.Schema)
		}
		// The source's console sees its usual paths; its links carry
		// its Prefix, which is this one's and /sources/<name>.
		s.mux.Handle("/sources/"+src.Name+"/", http.StripPrefix("/sources/"+src.Name, c))
	}
	s.schemas = strings.Join(schemas, ", ")
	funcs := template.FuncMap{
		"seconds":  func(f float64) string { return fmt.Sprintf("%.1f", f) },
		"short":    short,
		"pathPart": url.PathEscape,
	}
	for _, page := range []string{"sources", "message"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, err
		}
		s.pages[page] = t
	}
	first := s.sources[0].console // the static files are every console's
	s.mux.HandleFunc("GET /static/{file}", first.staticFile)
	s.mux.HandleFunc("GET /{$}", s.overview)
	s.mux.HandleFunc("GET /sources/{$}", s.overview)
	s.mux.HandleFunc("GET /dlq", s.overview)
	s.mux.HandleFunc("GET /api/sources", s.apiSources)
	s.mux.HandleFunc("GET /sources/{name}", s.toSource)
	return s, nil
}

// ServeHTTP implements http.Handler. A request for a host the console
// does not answer to (Config.AllowedHosts) is refused before anything
// else: 421 Misdirected Request.
func (s *Sources) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if w == nil || r == nil || s.mux == nil { // no response to write to, no request, or a zero Sources
		if w != nil {
			http.Error(w, "console: no request, or a Sources not created by console.NewSources", http.StatusInternalServerError)
		}
		return
	}
	securityHeaders(w)
	if !s.sources[0].console.hostAllowed(r) { // every source's console answers to the template's AllowedHosts
		misdirected(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// sourceRow is one source on the sources page and in /api/sources.
type sourceRow struct {
	Name      string `json:"name"`
	Schema    string `json:"schema"`
	Reachable bool   `json:"reachable"`
	// Error is why the source could not be read.
	Error string `json:"error,omitempty"`
	// Summary is nil when the source could not be read: no figure
	// rather than zeros that look healthy.
	Summary *admin.Summary `json:"summary,omitempty"`
}

// sourcesReport is what the sources page shows.
type sourcesReport struct {
	Sources []sourceRow `json:"sources"`
	// Total is over the reachable sources only.
	Total       admin.Summary `json:"total"`
	Reachable   int           `json:"reachable"`
	Unreachable int           `json:"unreachable"`
	// TotalState says over which sources Total is.
	TotalState string `json:"total_state"`
	// DeadLetters is whether the page is the one of the menu's "Dead
	// letters": the same table, led to each source's dead letters.
	DeadLetters bool `json:"-"`
}

// report reads every source's status at once, each bounded by the
// timeout: a source that has not answered by then is unreachable, and the
// report does not wait for it.
func (s *Sources) report(ctx context.Context) sourcesReport {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	type answer struct {
		i   int
		rep admin.Report
		err error
	}
	answers := make(chan answer, len(s.sources)) // room for every answer: a late one does not block its goroutine
	for i, src := range s.sources {
		go func() {
			rep, err := src.console.admin.Status(ctx, admin.Filter{})
			answers <- answer{i, rep, err}
		}()
	}
	rows := make([]sourceRow, len(s.sources))
	answered := make([]bool, len(s.sources))
	take := func(a answer) {
		answered[a.i] = true
		if a.err != nil {
			rows[a.i].Error = a.err.Error()
			if errors.Is(a.err, context.DeadlineExceeded) {
				rows[a.i].Error = fmt.Sprintf("no answer within %s: %v", s.timeout, a.err)
			}
			return
		}
		sum := a.rep.Summary()
		rows[a.i].Reachable, rows[a.i].Summary = true, &sum
	}
wait:
	for range s.sources {
		select {
		case a := <-answers:
			take(a)
		case <-ctx.Done():
			for { // the answers already in
				select {
				case a := <-answers:
					take(a)
				default:
					break wait
				}
			}
		}
	}
	rep := sourcesReport{Sources: rows}
	for i, src := range s.sources {
		row := &rows[i]
		row.Name, row.Schema = src.name, src.schema
		if !answered[i] {
			row.Error = fmt.Sprintf("no answer within %s", s.timeout)
			if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				row.Error = "not read: " + err.Error() // the request ended first
			}
		}
		if !row.Reachable {
			rep.Unreachable++
			s.logger.Info("Console: a source cannot be read", watermill.LogFields{"source": src.name, "error": row.Error})
			continue
		}
		rep.Reachable++
		rep.Total = rep.Total.Plus(*row.Summary)
	}
	rep.TotalState = totalState(rep.Reachable, rep.Unreachable)
	return rep
}

// totalState says over which sources the total is, the missing ones
// first.
func totalState(reachable, unreachable int) string {
	switch {
	case unreachable == 0 && reachable == 1:
		return "the source is reachable"
	case unreachable == 0:
		return fmt.Sprintf("all %d sources reachable", reachable)
	case reachable == 0:
		return fmt.Sprintf("INCOMPLETE: no source reachable (%d of %d unreachable): no total", unreachable, unreachable)
	}
	return fmt.Sprintf("INCOMPLETE: %d of %d sources unreachable, not counted: the total is over the %d reachable only",
		unreachable, reachable+unreachable, reachable)
}

// overview serves the sources page (also as the menu's "Dead letters":
// each source keeps its own).
func (s *Sources) overview(w http.ResponseWriter, r *http.Request) {
	rep := s.report(r.Context())
	title := "Sources"
	if r.URL.Path == "/dlq" {
		title, rep.DeadLetters = "Dead letters", true
	}
	s.render(w, "sources", http.StatusOK, view{Title: title, Data: rep})
}

// apiSources serves the sources page's figures as JSON.
func (s *Sources) apiSources(w http.ResponseWriter, r *http.Request) {
	rep := s.report(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(rep)
}

// toSource leads /sources/<name> to the source's console,
// /sources/<name>/, under the console's prefix (not the bare path the
// ServeMux would send to). An unknown name is not found.
func (s *Sources) toSource(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !slices.ContainsFunc(s.sources, func(m mounted) bool { return m.name == name }) {
		s.render(w, "message", http.StatusNotFound, view{Title: http.StatusText(http.StatusNotFound), Error: fmt.Sprintf("no source %s", quoted(100, name))})
		return
	}
	// Set as built: a known name (letters, digits, '.', '_', '-') under
	// the validated prefix, a path of this console.
	w.Header().Set("Location", s.prefix+"/sources/"+name+"/")
	w.WriteHeader(http.StatusMovedPermanently)
}

func (s *Sources) render(w http.ResponseWriter, page string, status int, v view) {
	v.Schema, v.ActionsOn, v.Base, v.Path = s.schemas, s.actions, s.prefix, "/"
	v.Error = visible(v.Error)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := s.pages[page].Execute(w, v); err != nil {
		s.logger.Error("Console: cannot render page", err, watermill.LogFields{"page": page})
	}
}

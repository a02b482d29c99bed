// Package console is the outbox's web console: an http.Handler to mount in
// an application (or run with `outbox serve`) that shows topics, consumer
// groups and a live partition grid (head, cursor, lag, lease, paused,
// degraded, backoff, last error; tiles coloured by state), charts of each
// group's lag and throughput over the last minutes (inline SVG, sampled
// only while someone looks: Config.HistoryWindow), browses dead letters,
// and, when enabled, pauses, resumes and resets partitions and replays or
// discards dead letters.
//
//	c, err := console.New(console.Config{Pool: pool}, logger)
//	http.Handle("/outbox/", http.StripPrefix("/outbox", c))
//
// Security: the console answers only requests whose Host header names it
// (localhost, 127.0.0.1, [::1] and Config.AllowedHosts; others get 421
// Misdirected Request), so that a page of another site cannot read it
// through DNS rebinding. It is read-only unless Config.EnableActions;
// actions then need Config.Token (as "Authorization: Bearer <token>", the
// scheme in any case, or as the password of HTTP basic auth; no challenge
// is sent, so a browser shows the refusal instead of a password prompt: in
// a browser, put the console behind the host application's authentication
// with Config.Authorize, or a proxy that adds the header) or pass
// Config.Authorize, and carry a CSRF token bound to the console and checked
// with the request's Origin. Every link and redirect made from request
// input stays on the console. Every value shown is escaped by html/template
// (a payload of <script> renders as text) and long values are cut, with a
// way to the whole (a payload downloads as an attachment); every query
// takes request input as bind parameters only; database calls are bounded
// by Config.Timeout. No front-end build step: templates and a little plain
// JavaScript, embedded.
package console

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/outboxtype"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config configures a Console.
type Config struct {
	// Pool is the outbox database. Required.
	Pool *pgxpool.Pool
	// Schema is the outbox schema (DefaultSchema when empty).
	Schema string
	// EnableActions allows pause, resume, reset, replay and discard.
	// Without it the console is read-only and refuses every action (403).
	EnableActions bool
	// Token, when set, is required for actions: "Authorization: Bearer
	// <token>", or HTTP basic auth with the token as the password.
	Token string
	// Authorize, when set, decides instead of Token (e.g. the host
	// application's session). EnableActions needs Token or Authorize.
	Authorize func(*http.Request) bool
	// Timeout bounds the database work of one request (default 10 s).
	Timeout time.Duration
	// RefreshInterval is how often the partition grid polls (default 1 s).
	RefreshInterval time.Duration
	// Prefix is the path the console is mounted under, e.g. "/outbox"
	// with http.StripPrefix("/outbox", c); "" for the root. A clean
	// absolute path without a trailing slash.
	Prefix string
	// AllowedHosts are the names the console answers to besides
	// localhost, 127.0.0.1 and [::1] (which it answers to at any port):
	// host names or IP addresses, each with an optional port to answer on
	// that port only ("ops.example.com", "10.0.0.5:8080", "[fd00::5]:8443"),
	// compared case-insensitively with each request's Host header. A
	// request for any other host is answered 421 Misdirected Request, so
	// that a page of another site cannot read the console through DNS
	// rebinding (a name of the attacker's that resolves to the console's
	// address). The default, none, is safe for a console mounted in an
	// application: it answers on loopback only until the application
	// names the hosts it is reached under. Behind a reverse proxy, name
	// the host the proxy passes on.
	AllowedHosts []string
	// HistoryWindow is how far back the group page's charts of lag and
	// throughput go (default 10 min, DefaultHistoryWindow), HistoryInterval
	// the time between two samples (default 5 s, DefaultHistoryInterval).
	// The console samples a group while its page is open (or its status or
	// history API is read), never on its own: idle, it costs nothing.
	HistoryWindow   time.Duration
	HistoryInterval time.Duration
	// Payloads, when set, renders each dead letter's payload that is in a
	// schema registry's wire format as JSON beside its raw bytes: pass a
	// *schema.Codec (schema.New with the registry's client and no
	// Schemas). A payload the registry cannot decode shows why instead.
	// Each decoding is bounded by Timeout too.
	Payloads PayloadDecoder
}

// Validate reports the first impossible setting.
func (c Config) Validate() error {
	if c.Pool == nil {
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	}
	if c.Schema != "" {
		if err := names.Schema(c.Schema); err != nil {
			return err
		}
	}
	if c.EnableActions && c.Token == "" && c.Authorize == nil {
		return &outboxtype.ConfigError{Field: "EnableActions", Reason: "actions need authentication: set Token or Authorize"}
	}
	if c.Timeout < 0 || c.RefreshInterval < 0 {
		return &outboxtype.ConfigError{Field: "Timeout/RefreshInterval", Reason: "must not be negative"}
	}
	if !validPrefix(c.Prefix) {
		return &outboxtype.ConfigError{Field: "Prefix", Reason: fmt.Sprintf("%s is not a clean absolute path without a trailing slash (e.g. \"/outbox\"; \"\" for the root)", quoted(100, c.Prefix))}
	}
	if _, err := hostRules(c.AllowedHosts); err != nil {
		return err
	}
	return c.validateHistory()
}

// Console is the web console; it is an http.Handler.
type Console struct {
	cfg     Config
	logger  watermill.LoggerAdapter
	admin   *admin.Admin
	store   *deadletter.Store
	pages   map[string]*template.Template
	mux     *http.ServeMux
	hosts   []hostRule
	static  fs.FS
	secret  []byte   // CSRF tokens and flash messages are HMACs under it
	history *history // the samples the charts draw
	// source and home: the source this console shows and the path of
	// the sources page, for a console mounted by NewSources ("" else).
	source, home string
}

// New creates a Console.
func New(cfg Config, logger watermill.LoggerAdapter) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Schema == "" {
		cfg.Schema = outbox.DefaultSchema
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = time.Second
	}
	cfg.HistoryWindow, cfg.HistoryInterval = cmp.Or(cfg.HistoryWindow, DefaultHistoryWindow), cmp.Or(cfg.HistoryInterval, DefaultHistoryInterval)
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	adm, err := admin.New(admin.Config{Schema: cfg.Schema, Pool: cfg.Pool}, logger)
	if err != nil {
		return nil, err
	}
	store, err := deadletter.NewStore(deadletter.Config{Schema: cfg.Schema, Pool: cfg.Pool}, logger)
	if err != nil {
		return nil, err
	}
	hosts, err := hostRules(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, logger: logger, admin: adm, store: store, pages: map[string]*template.Template{}, hosts: hosts, secret: make([]byte, 32),
		history: newHistory(cfg.HistoryWindow, cfg.HistoryInterval, cfg.RefreshInterval)}
	if _, err := rand.Read(c.secret); err != nil {
		return nil, err
	}
	funcs := template.FuncMap{
		"ago":      func(t *time.Time) string { return ago(t) },
		"seconds":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"payload":  viewPayload,
		"clip":     clip,
		"short":    short,
		"join":     strings.Join,
		"rfc3339":  func(t time.Time) string { return t.Format(time.RFC3339) },
		"pathPart": url.PathEscape,
		"bytes":    humanBytes,
		"state":    stateOf,
	}
	for _, page := range []string{"overview", "group", "dlq", "entry", "message", "confirm"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/charts.html", "templates/"+page+".html")
		if err != nil {
			return nil, err
		}
		c.pages[page] = t
	}
	c.static, _ = fs.Sub(assets, "static")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /static/{file}", c.staticFile)
	mux.HandleFunc("GET /{$}", c.overview)
	mux.HandleFunc("GET /groups/{topic}/{group}", c.group)
	mux.HandleFunc("GET /api/status", c.apiStatus)
	mux.HandleFunc("GET /api/history", c.apiHistory)
	mux.HandleFunc("GET /dlq", c.dlq)
	mux.HandleFunc("GET /dlq/{id}", c.entry)
	mux.HandleFunc("GET /dlq/{id}/payload", c.payload)
	mux.HandleFunc("GET /confirm/{action}", c.confirm)
	mux.HandleFunc("POST /actions/{action}", c.action)
	c.mux = mux
	return c, nil
}

// securityHeaders sets the headers every response of the console carries:
// its own scripts and styles only, never in a frame, no MIME sniffing, no
// referrer to other sites.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
}

// ServeHTTP implements http.Handler. A request for a host the console
// does not answer to (Config.AllowedHosts) is refused before anything
// else: 421 Misdirected Request.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if w == nil || r == nil || c.mux == nil { // no response to write to, no request, or a zero Console
		if w != nil {
			http.Error(w, "console: no request, or a Console not created by console.New", http.StatusInternalServerError)
		}
		return
	}
	securityHeaders(w)
	if !c.hostAllowed(r) {
		misdirected(w, r)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// staticFile serves one of the console's own files; there is no listing.
func (c *Console) staticFile(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if st, err := fs.Stat(c.static, name); err != nil || st.IsDir() {
		http.NotFound(w, r)
		return
	}
	http.ServeFileFS(w, r, c.static, name)
}

// view is what every page gets.
type view struct {
	Title        string
	Schema       string
	ActionsOn    bool
	CSRF         string
	Flash, Error string
	Refresh      int // ms
	Data         any
	TopicFilter  string
	GroupFilter  string
	StatusFilter string
	NextCursor   string
	Base         string // the mount prefix
	Path         string // this page, for the actions' way back (localTarget)
	Source, Home string // a source's console (NewSources): its name and the sources page
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, page string, status int, v view) {
	v.Schema, v.ActionsOn, v.CSRF, v.Base, v.Path = c.cfg.Schema, c.cfg.EnableActions, c.csrfToken(), c.cfg.Prefix, localTarget(r.URL.RequestURI())
	v.Source, v.Home = c.source, c.home
	v.Refresh = int(c.cfg.RefreshInterval / time.Millisecond)
	if q := r.URL.Query(); q.Get("flash") != "" && hmac.Equal([]byte(q.Get("flash_mac")), []byte(c.mac("flash", q.Get("flash")))) {
		v.Flash = q.Get("flash") // only the console's own: a link cannot put words on its pages
	}
	v.Flash, v.Error = visible(v.Flash), visible(v.Error)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := c.pages[page].Execute(w, v); err != nil {
		c.logger.Error("Console: cannot render page", err, watermill.LogFields{"page": page})
	}
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	status = unavailable(status, err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	c.render(w, r, "message", status, view{Title: http.StatusText(status), Error: err.Error()})
}

// unavailable turns an internal error (500) that is the database not
// answering into 503 Service Unavailable: a connection that could not be
// made, or no answer within Config.Timeout. The console is fine; what it
// reads from is not, for now — a load balancer or a monitor tells the two
// apart by it.
func unavailable(status int, err error) int {
	if status != http.StatusInternalServerError {
		return status
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable
	}
	return status
}

func (c *Console) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.cfg.Timeout)
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	rep, err := c.admin.Status(ctx, admin.Filter{})
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.history.record(rep, time.Now())
	c.render(w, r, "overview", http.StatusOK, view{Title: "Overview", Data: rep})
}

func (c *Console) group(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	topic, group := r.PathValue("topic"), r.PathValue("group")
	rep, err := c.admin.Status(ctx, admin.Filter{Group: group, Topic: topic})
	if errors.Is(err, sentinel.ErrNotFound) { // no such group or topic
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.history.record(rep, time.Now())
	for _, t := range rep.Topics {
		for _, g := range t.Groups {
			if g.Group == group {
				c.render(w, r, "group", http.StatusOK, view{Title: short(100, group) + " on " + short(100, topic), Data: c.groupPage(topic, g), TopicFilter: topic, GroupFilter: group})
				return
			}
		}
	}
	c.fail(w, r, http.StatusNotFound, fmt.Errorf("no consumer group %s on topic %s", quoted(200, group), quoted(250, topic)))
}

// apiStatus serves the status of one group and topic as JSON, for the
// grid's live updates.
func (c *Console) apiStatus(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	rep, err := c.admin.Status(ctx, admin.Filter{Group: r.URL.Query().Get("group"), Topic: r.URL.Query().Get("topic")})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, sentinel.ErrNotFound) { // no such group or topic
			status = http.StatusNotFound
		}
		w.WriteHeader(unavailable(status, err))
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	c.history.record(rep, time.Now())
	_ = json.NewEncoder(w).Encode(rep)
}

func (c *Console) dlq(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	q := r.URL.Query()
	opts := deadletter.ListOptions{Filter: deadletter.Filter{Group: q.Get("group"), Topic: q.Get("topic")}, Cursor: q.Get("after"), Limit: 50, Descending: true}
	if s := q.Get("status"); s != "" {
		opts.Statuses = []deadletter.Status{deadletter.Status(s)}
	}
	page, err := c.store.List(ctx, opts)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrInvalidArgument) {
			status = http.StatusBadRequest
		}
		c.fail(w, r, status, err)
		return
	}
	c.render(w, r, "dlq", http.StatusOK, view{Title: "Dead letters", Data: page.Entries, NextCursor: page.NextCursor,
		GroupFilter: opts.Group, TopicFilter: opts.Topic, StatusFilter: q.Get("status")})
}

func (c *Console) entry(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, errors.New("the id of a dead letter is a number"))
		return
	}
	e, err := c.store.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "entry", http.StatusOK, view{Title: fmt.Sprintf("Dead letter %d", e.ID), Data: entryView{Entry: e, Decoded: c.decode(ctx, e.Payload)}})
}

// payload sends a dead letter's payload whole, as a file to save: never
// rendered by the browser, whatever it holds.
func (c *Console) payload(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, errors.New("the id of a dead letter is a number"))
		return
	}
	e, err := c.store.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		c.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="dead-letter-%d.payload"`, e.ID))
	h.Set("Content-Length", strconv.Itoa(len(e.Payload)))
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(e.Payload)
}

func ago(t *time.Time) string {
	if t == nil {
		return "-"
	}
	d := time.Until(*t).Round(time.Second)
	if d < 0 {
		return (-d).String() + " ago"
	}
	return "in " + d.String()
}

// humanBytes writes n bytes in binary units: 512 B, 1.5 KiB, 3.2 GiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(n)/float64(div), 'f', 1, 64) + " " + string("KMGTPE"[exp]) + "iB"
}

package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/backoff"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// A Fleet runs one Pipeline per source: a sharded application's databases
// (each its own PostgreSQL primary, each with its outbox schema) forwarded
// by one process into one broker. Each source's pipeline reads and leases
// in its own database, so any number of Fleet instances over the same
// sources share every source's partitions, as pipelines do; a source whose
// database is down is retried on its own while the others go on.
//
// Every message forwarded carries its source's name (metadata
// outbox.MetadataSource), and the Kafka target fences and reads back per
// source: two databases number their messages alike (forwarder.Config's
// Source). Per-key order holds as long as each key lives in one source:
// same key → same shard → same outbox partition → same Kafka partition
// (docs/sharding.md).

// DefaultCheckInterval is how often a Fleet checks that each source's
// database answers, by default (FleetConfig.CheckInterval).
const DefaultCheckInterval = 5 * time.Second

// MinCheckTimeout is the least time a Fleet's check of a source's
// database waits for its answer before it calls the source unreachable,
// however short FleetConfig.CheckInterval is.
const MinCheckTimeout = time.Second

// Source is one database of a Fleet.
type Source struct {
	// Name names the source in every message it forwards (metadata
	// outbox.MetadataSource), in Kafka transactional ids, metric labels,
	// logs and status: ASCII letters, digits, '.', '_' and '-', unique in
	// the Fleet and the same in every instance of it. Required.
	Name string
	// Pool is the source's database. Required. The Fleet does not close
	// it.
	Pool *pgxpool.Pool
	// Schema is the source's outbox schema (outbox.DefaultSchema when
	// empty).
	Schema string
}

// validate reports what is wrong with s, naming the field by its path.
func (s Source) validate(field string) error {
	if err := names.Source(s.Name); err != nil {
		return err
	}
	if s.Pool == nil {
		return &outboxtype.ConfigError{Field: field + ".Pool", Reason: fmt.Sprintf("required (source %s)", s.Name)}
	}
	if s.Schema != "" {
		return names.Schema(s.Schema)
	}
	return nil
}

// FleetConfig configures a Fleet.
type FleetConfig struct {
	// Sources are the databases to run a pipeline for at the start; Add
	// and Remove change them at run time. May be empty.
	Sources []Source
	// Pipeline is every source's pipeline configuration: Forward (the
	// Target is shared by every source), Sequencer, WAL, Retention and the
	// Disable switches. Leave its Pool, Schema and Source empty: each
	// source's are its own.
	Pipeline Config
	// CheckInterval is how often the Fleet checks that each source's
	// database answers (a query bounded by the interval, or by
	// MinCheckTimeout when the interval is shorter: a database that takes
	// 30 ms to open a connection is slow, not unreachable), for Status and
	// the metric outbox_source_up (DefaultCheckInterval when 0).
	CheckInterval time.Duration
	// RestartBackoff bounds the wait before a source's pipeline that
	// stopped with an error is started again (it doubles from a second up
	// to this; 30 s when 0).
	RestartBackoff time.Duration
	// TrimIdleAfter is how long a source's pool must have had an idle
	// connection at hand for every acquire before the Fleet closes its
	// idle connections but one (DefaultTrimIdleAfter, a minute, when 0;
	// negative: never). A quiet source then holds two connections, its
	// process's LISTEN connection and one in the pool, instead of what its
	// pool opened at the start or in its last burst (pgxpool keeps an idle
	// connection for 30 minutes by default). The check runs with the
	// database check, every CheckInterval; the pool keeps at least its
	// MinConns and MinIdleConns.
	TrimIdleAfter time.Duration
}

// DefaultTrimIdleAfter is the default FleetConfig.TrimIdleAfter.
const DefaultTrimIdleAfter = time.Minute

func (c *FleetConfig) setDefaults() {
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = 30 * time.Second
	}
	if c.TrimIdleAfter == 0 {
		c.TrimIdleAfter = DefaultTrimIdleAfter
	}
}

// Validate reports the first impossible setting as an *outboxtype.ConfigError
// (or *outboxtype.NameError), naming the field by its path in FleetConfig.
func (c FleetConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Pipeline.Pool != nil:
		return &outboxtype.ConfigError{Field: "Pipeline.Pool", Reason: "each source's is its own: leave it nil and list the databases in Sources"}
	case c.Pipeline.Schema != "":
		return &outboxtype.ConfigError{Field: "Pipeline.Schema", Reason: "each source's is its own (Source.Schema): leave it empty"}
	case c.Pipeline.Source != "":
		return &outboxtype.ConfigError{Field: "Pipeline.Source", Reason: "each source's is its own (Source.Name): leave it empty"}
	case c.CheckInterval < 0:
		return &outboxtype.ConfigError{Field: "CheckInterval", Reason: "must not be negative"}
	case c.RestartBackoff < 0:
		return &outboxtype.ConfigError{Field: "RestartBackoff", Reason: "must not be negative"}
	}
	seen := map[string]bool{}
	outboxes := map[string]string{} // database and schema -> the source that reads it
	for i, s := range c.Sources {
		field := fmt.Sprintf("Sources[%d]", i)
		if err := s.validate(field); err != nil {
			return err
		}
		if seen[s.Name] {
			return &outboxtype.ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("source %q listed twice", s.Name)}
		}
		seen[s.Name] = true
		where := outboxOf(s)
		if other, ok := outboxes[where]; ok {
			return &outboxtype.ConfigError{Field: field, Reason: fmt.Sprintf("source %q reads the same outbox as source %q (%s): one outbox under two names would be forwarded twice, under two ids; list it once", s.Name, other, where)}
		}
		outboxes[where] = s.Name
	}
	// The template must make a valid pipeline for any source: checked with
	// a stand-in source (Validate only looks at whether Pool is set).
	probe := c.Pipeline
	probe.Pool, probe.Source = &pgxpool.Pool{}, "probe"
	return prefix("Pipeline.", probe.Validate())
}

// outboxOf names the outbox a source reads: its database (host, port and
// name, from the pool's configuration; the pool itself when it has none,
// as a pgxpool.Pool not made by pgxpool.New) and schema.
func outboxOf(s Source) string {
	schema := s.Schema
	if schema == "" {
		schema = names.DefaultSchema
	}
	return poolDatabase(s.Pool) + ", schema " + schema
}

// poolDatabase names the database of pool: "database D on host:port".
func poolDatabase(pool *pgxpool.Pool) (name string) {
	defer func() {
		if recover() != nil { // a zero Pool has no Config to copy
			name = fmt.Sprintf("pool %p", pool)
		}
	}()
	cc := pool.Config().ConnConfig
	return fmt.Sprintf("database %s on %s:%d", cc.Database, cc.Host, cc.Port)
}

// pipelineFor is the configuration of s's pipeline.
func (c FleetConfig) pipelineFor(s Source) Config {
	cfg := c.Pipeline
	cfg.Pool, cfg.Schema, cfg.Source = s.Pool, s.Schema, s.Name
	if cfg.WAL != nil {
		wal := *cfg.WAL
		cfg.WAL = &wal
	}
	return cfg
}

// SourceState is what a source's pipeline is doing.
type SourceState string

// The states of a source.
const (
	// SourceStarting: the pipeline is being started (or the Fleet is not
	// running yet).
	SourceStarting SourceState = "starting"
	// SourceRunning: the pipeline runs and the database answered its last
	// check.
	SourceRunning SourceState = "running"
	// SourceUnreachable: the pipeline runs but the database did not
	// answer its last check: nothing of this source is forwarded until it
	// does (the pipeline retries on its own).
	SourceUnreachable SourceState = "unreachable"
	// SourceRestarting: the pipeline stopped with an error (LastError) and
	// is started again after a backoff.
	SourceRestarting SourceState = "restarting"
	// SourceStopped: the pipeline was stopped (the Fleet closed, or the
	// source is being removed).
	SourceStopped SourceState = "stopped"
)

// SourceStatus is what a Fleet knows of one source.
type SourceStatus struct {
	Name, Schema string
	State        SourceState
	// Since is when the source entered State.
	Since time.Time
	// LastCheck is when its database was last checked; LastError the
	// error of the last failed check or pipeline run ("" when none since
	// it last answered).
	LastCheck time.Time
	LastError string
	// Restarts counts the times its pipeline stopped with an error and was
	// started again.
	Restarts int
	// Stats are its pipeline's running totals (of the pipeline running
	// now: a restart starts them again).
	Stats Stats
}

// Fleet runs a pipeline for each of a set of sources. Create it with
// NewFleet, run it with Run, change its sources with Add and Remove,
// stop it with Close.
type Fleet struct {
	cfg    FleetConfig
	logger watermill.LoggerAdapter
	life   startstop.Service

	mu      sync.Mutex
	ctx     context.Context // of the Run under way; nil before
	stopped bool            // Run has stopped (or is stopping) its sources
	sources map[string]*fleetSource
}

// fleetSource is one source of a Fleet and what runs it.
type fleetSource struct {
	src    Source
	logger watermill.LoggerAdapter

	mu       sync.Mutex
	state    SourceState
	since    time.Time
	check    time.Time
	lastErr  string
	restarts int
	pipeline *Pipeline
	removing bool // under the Fleet's mu

	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutines have returned

	// The trim of idle pool connections (watch's goroutine only): the
	// pool's count of acquires that found no idle connection, as last
	// read, and since when it has not moved.
	emptyAcquires int64
	ampleSince    time.Time
}

// NewFleet creates a Fleet of cfg.Sources; Run starts their pipelines.
func NewFleet(cfg FleetConfig, logger watermill.LoggerAdapter) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	f := &Fleet{cfg: cfg, logger: logger.With(watermill.LogFields{"component": "outbox.fleet"}),
		life: startstop.Service{Name: "pipeline.Fleet"}, sources: map[string]*fleetSource{}}
	for _, s := range cfg.Sources {
		f.sources[s.Name] = f.newSource(s)
	}
	return f, nil
}

func (f *Fleet) newSource(s Source) *fleetSource {
	if s.Schema == "" {
		s.Schema = names.DefaultSchema
	}
	return &fleetSource{src: s, logger: f.logger.With(watermill.LogFields{"source": s.Name}), state: SourceStarting, since: time.Now()}
}

// Run runs every source's pipeline until ctx ends or Close is called, and
// returns nil then. A source's pipeline that stops with an error is logged,
// shown in Status and started again after a backoff: one source never
// stops the others. It runs once: a second Run while it runs is
// outbox.ErrAlreadyRunning, a Run after it stopped outbox.ErrClosed.
func (f *Fleet) Run(ctx context.Context) error {
	if f == nil || f.sources == nil {
		return errs.NotConstructed("pipeline.Fleet", "pipeline.NewFleet")
	}
	if ctx == nil {
		return fmt.Errorf("%w: pipeline.Fleet.Run: nil context", sentinel.ErrInvalidArgument)
	}
	return f.life.Run(ctx, nil, f.run)
}

func (f *Fleet) run(ctx context.Context) error {
	f.mu.Lock()
	f.ctx = ctx
	for _, s := range f.sources {
		f.start(s)
	}
	f.mu.Unlock()
	<-ctx.Done()
	f.mu.Lock()
	f.stopped = true
	running := make([]*fleetSource, 0, len(f.sources))
	for _, s := range f.sources {
		running = append(running, s)
	}
	f.mu.Unlock()
	for _, s := range running {
		s.stop()
	}
	return nil
}

// start starts s's pipeline and checker in goroutines of the Fleet; f.mu
// is held and the Fleet runs.
func (f *Fleet) start(s *fleetSource) {
	ctx, cancel := context.WithCancel(f.ctx)
	s.cancel, s.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { f.supervise(ctx, s) })
	wg.Go(func() { f.watch(ctx, s) })
	f.life.Go(func() {
		wg.Wait()
		close(s.done)
	})
}

// stop stops s's goroutines and waits for them (its pipeline closed).
func (s *fleetSource) stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}

// supervise runs s's pipeline until ctx ends, starting it again after a
// backoff when it stops with an error.
func (f *Fleet) supervise(ctx context.Context, s *fleetSource) {
	defer func() {
		s.mu.Lock()
		s.set(SourceStopped)
		s.mu.Unlock()
	}()
	failures := 0
	for ctx.Err() == nil {
		p, err := New(f.cfg.pipelineFor(s.src), s.logger)
		if err != nil { // validated by Add and NewFleet: not expected
			s.failed(err)
			s.logger.Error("The source's pipeline cannot be created", err, nil)
			return
		}
		s.mu.Lock()
		s.pipeline = p
		if s.state == SourceStarting || s.state == SourceRestarting {
			s.set(SourceRunning)
		}
		s.mu.Unlock()
		started := time.Now()
		err = p.Run(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the pipeline stopped without an error")
		}
		if time.Since(started) > time.Minute {
			failures = 0
		}
		failures++
		wait := backoff.Exponential(time.Second, f.cfg.RestartBackoff, failures)
		s.failed(err)
		s.logger.Error("The source's pipeline stopped; starting it again after a backoff (the other sources go on)", err, watermill.LogFields{"retry_in": wait.String()})
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// failed records a pipeline that stopped with err.
func (s *fleetSource) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restarts++
	s.lastErr = err.Error()
	s.set(SourceRestarting)
}

// set moves s to state; s.mu is held.
func (s *fleetSource) set(state SourceState) {
	if s.state != state {
		s.state, s.since = state, time.Now()
	}
}

// watch checks s's database every CheckInterval until ctx ends.
func (f *Fleet) watch(ctx context.Context, s *fleetSource) {
	defer observe.Current().SourceRemoved(s.src.Name)
	tick := time.NewTicker(f.cfg.CheckInterval)
	defer tick.Stop()
	s.emptyAcquires, s.ampleSince = s.src.Pool.Stat().EmptyAcquireCount(), time.Now()
	for {
		f.checkOnce(ctx, s)
		f.trimIdle(ctx, s)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// checkOnce checks s's database once.
func (f *Fleet) checkOnce(ctx context.Context, s *fleetSource) {
	cctx, cancel := context.WithTimeout(ctx, max(f.cfg.CheckInterval, MinCheckTimeout))
	defer cancel()
	_, err := s.src.Pool.Exec(cctx, "SELECT 1")
	if ctx.Err() != nil {
		return
	}
	observe.Current().SourceUp(s.src.Name, err == nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check = time.Now()
	switch {
	case err != nil && s.state == SourceRunning:
		s.set(SourceUnreachable)
		s.lastErr = err.Error()
		s.logger.Error("The source's database does not answer: nothing of it is forwarded until it does (the other sources go on)", err, nil)
	case err != nil:
		s.lastErr = err.Error()
	case s.state == SourceUnreachable:
		s.set(SourceRunning)
		s.lastErr = ""
		s.logger.Info("The source's database answers again", nil)
	case s.state == SourceRunning:
		s.lastErr = ""
	}
}

// trimIdle closes the idle connections of s's pool but one (or its
// MinConns, MinIdleConns) once every acquire of the last TrimIdleAfter
// found an idle connection at hand: the source is quiet, and what its
// pool opened for its last burst is not needed. A burst later opens what
// it needs again; a pool that had to open a connection for an acquire is
// left alone for TrimIdleAfter, so a source that needs two connections at
// times reopens at most one per TrimIdleAfter.
func (f *Fleet) trimIdle(ctx context.Context, s *fleetSource) {
	if f.cfg.TrimIdleAfter < 0 || ctx.Err() != nil {
		return
	}
	pool := s.src.Pool
	now := time.Now()
	if n := pool.Stat().EmptyAcquireCount(); n != s.emptyAcquires {
		s.emptyAcquires, s.ampleSince = n, now
		return
	}
	if now.Sub(s.ampleSince) < f.cfg.TrimIdleAfter {
		return
	}
	cfg := pool.Config()
	keep := max(1, int(cfg.MinConns), int(cfg.MinIdleConns))
	if int(pool.Stat().IdleConns()) <= keep {
		return
	}
	idle := pool.AcquireAllIdle(ctx)
	closed := 0
	for i, c := range idle {
		if i < keep {
			c.Release()
			continue
		}
		conn := c.Hijack()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(cctx)
		cancel()
		closed++
	}
	// Acquires that came while the pool's idle connections were taken
	// here found none: not a sign of need.
	s.emptyAcquires = pool.Stat().EmptyAcquireCount()
	if closed > 0 {
		s.logger.Debug("Closed the idle connections of a quiet source's pool", watermill.LogFields{"closed": closed, "kept": min(keep, len(idle))})
	}
}

// Add adds a source; while the Fleet runs, its pipeline starts at once. A
// source whose name the Fleet has is refused (an *outboxtype.ConfigError).
func (f *Fleet) Add(s Source) error {
	if f == nil || f.sources == nil {
		return errs.NotConstructed("pipeline.Fleet", "pipeline.NewFleet")
	}
	if err := s.validate("Source"); err != nil {
		return err
	}
	if err := f.cfg.pipelineFor(s).Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.life.Closed() || f.stopped {
		return fmt.Errorf("%w: pipeline.Fleet.Add after the Fleet stopped", sentinel.ErrClosed)
	}
	if old, ok := f.sources[s.Name]; ok {
		reason := fmt.Sprintf("the fleet has a source %q already: Remove it first", s.Name)
		if old.removing {
			reason = fmt.Sprintf("source %q is being removed: Add it again once Remove has returned", s.Name)
		}
		return &outboxtype.ConfigError{Field: "Source.Name", Reason: reason}
	}
	where := outboxOf(s)
	for name, other := range f.sources {
		if !other.removing && outboxOf(other.src) == where {
			return &outboxtype.ConfigError{Field: "Source", Reason: fmt.Sprintf("source %q reads the same outbox as source %q (%s): one outbox under two names would be forwarded twice, under two ids", s.Name, name, where)}
		}
	}
	fs := f.newSource(s)
	f.sources[s.Name] = fs
	if f.ctx != nil && f.ctx.Err() == nil {
		f.start(fs)
	}
	f.logger.Info("Source added", watermill.LogFields{"source": s.Name, "schema": fs.src.Schema})
	return nil
}

// Remove stops the pipeline of the source named name and waits for it
// (sends in flight finish, leases are released: the Fleet's other
// instances take its partitions over if they still have it), then forgets
// it. An unknown name is an *outboxtype.ConfigError.
func (f *Fleet) Remove(name string) error {
	if f == nil || f.sources == nil {
		return errs.NotConstructed("pipeline.Fleet", "pipeline.NewFleet")
	}
	f.mu.Lock()
	s, ok := f.sources[name]
	removing := ok && s.removing
	if ok {
		s.removing = true // kept until stopped: an Add of the name waits for it
	}
	f.mu.Unlock()
	switch {
	case !ok:
		return &outboxtype.ConfigError{Field: "name", Reason: fmt.Sprintf("the fleet has no source %q", name)}
	case removing:
		return &outboxtype.ConfigError{Field: "name", Reason: fmt.Sprintf("source %q is being removed already", name)}
	}
	s.stop()
	f.mu.Lock()
	delete(f.sources, name)
	f.mu.Unlock()
	f.logger.Info("Source removed", watermill.LogFields{"source": name})
	return nil
}

// Status returns what the Fleet knows of each source, by name.
func (f *Fleet) Status() []SourceStatus {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	all := make([]*fleetSource, 0, len(f.sources))
	for _, s := range f.sources {
		all = append(all, s)
	}
	f.mu.Unlock()
	out := make([]SourceStatus, 0, len(all))
	for _, s := range all {
		s.mu.Lock()
		st := SourceStatus{Name: s.src.Name, Schema: s.src.Schema, State: s.state, Since: s.since,
			LastCheck: s.check, LastError: s.lastErr, Restarts: s.restarts}
		p := s.pipeline
		s.mu.Unlock()
		st.Stats = p.Stats()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b SourceStatus) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Close stops every source's pipeline and waits until Run has returned.
// It closes neither the Target nor the sources' pools.
func (f *Fleet) Close() error {
	if f == nil || f.sources == nil {
		return nil
	}
	f.life.Close()
	return nil
}

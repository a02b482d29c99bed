// Package pipeline runs everything between an application's commit and its
// broker, for one outbox schema, as one component: the Sequencer (gap-free
// seq in commit order), optionally the log-based mode's relay, a Forwarder
// of a set of topics to a Target (Kafka, NATS JetStream) with the schema's
// dead letters, and a retention Vacuum (on by default). It is what `outbox
// relay` runs, for an application that would rather run it in its own
// process. Its metrics are package metrics' (metrics.Enable, once per
// process), which this package does not link, so that an application
// without Prometheus does not link it either.
//
//	p, err := pipeline.New(pipeline.Config{
//		Pool:    pool,
//		Forward: forwarder.Config{Topics: []string{"orders"}, Target: target},
//	}, logger)
//	...
//	err = p.Run(ctx) // until ctx ends (SIGTERM) or p.Close()
//
// Defaults, chosen for a service that forwards what it publishes: a
// message the Target refuses for good goes to the schema's dead_letters
// table at once, failed sends (the broker down) are retried until it is
// back (forwarder.Config's defaults); consumed rows are deleted as soon
// as every consumer group is past them and dealt-with dead letters after
// a week (retention.Config's defaults). Run as many pipelines on the same
// schema as you like, in one process or many: they share the partitions
// through leases, and their sequencers and vacuums take turns.
//
// Run has the lifecycle of every long-running component of the outbox: it
// runs once, returns nil when its context ends or Close is called, and an
// error when a component cannot start or stops for good (the others are
// stopped then); Close stops it and waits, giving sends in flight the
// Subscriber's CloseTimeout (docs/operations.md, "Clean shutdown").
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/sentinel"
	"github.com/millrace/watermill-outbox/internal/startstop"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"
)

// Config configures a Pipeline. Every component's Schema and Pool are the
// pipeline's: leave them empty in the nested configurations (or set them
// to the same values).
type Config struct {
	// Schema is the outbox schema (outbox.DefaultSchema when empty).
	Schema string
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Source names the database when several forward into one broker
	// (forwarder.Config.Source; a Fleet sets it for each of its sources).
	// Empty for one database.
	Source string
	// Forward configures the Forwarder: Topics and Target are required
	// to forward anything; without Topics the pipeline runs no forwarder
	// (a sequencer, relay and vacuum only, like `outbox pipeline` without
	// --topic). Its Subscriber runs no sequencer of its own: the
	// pipeline's serves every topic.
	Forward forwarder.Config
	// Sequencer tunes the sequencer (its defaults when zero; a zero
	// MinPassInterval follows Forward.Subscriber.Tuning's profile, as the
	// WAL relay's MinAppendInterval does: see adaptive.Tuning.AppendInterval).
	Sequencer outbox.SequencerConfig
	// DisableSequencer runs no sequencer: for a schema published only in
	// outbox.ModeWAL (set WAL), or whose sequencer runs elsewhere.
	DisableSequencer bool
	// WAL, when set, also runs the log-based mode's relay with this
	// configuration (its defaults when zero; the schema's slot must exist,
	// relay.CreateSlot): for Publishers in outbox.ModeWAL.
	WAL *relay.Config
	// Retention configures the Vacuum that keeps the log bounded (its
	// defaults when zero: consumed rows go as soon as every group is past
	// them, dealt-with dead letters after a week).
	Retention retention.Config
	// DisableRetention runs no Vacuum: the log and the dead letters then
	// grow until something else deletes them.
	DisableRetention bool
}

// withSchema fills the nested configurations' Schema and Pool with the
// pipeline's, and reports a nested one set to something else.
func (c *Config) withSchema() error {
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
	set := func(field string, schema *string, pool **pgxpool.Pool) error {
		if *schema != "" && *schema != c.Schema {
			return &outboxtype.ConfigError{Field: field + ".Schema", Reason: fmt.Sprintf("%q, not the pipeline's schema %q: leave it empty", *schema, c.Schema)}
		}
		if *pool != nil && *pool != c.Pool {
			return &outboxtype.ConfigError{Field: field + ".Pool", Reason: "not the pipeline's Pool: leave it nil"}
		}
		*schema, *pool = c.Schema, c.Pool
		return nil
	}
	if err := set("Forward.Subscriber", &c.Forward.Subscriber.Schema, &c.Forward.Subscriber.Pool); err != nil {
		return err
	}
	c.Forward.Subscriber.DisableSequencer = true
	if c.Forward.Source != "" && c.Forward.Source != c.Source {
		return &outboxtype.ConfigError{Field: "Forward.Source", Reason: fmt.Sprintf("%q, not the pipeline's source %q: leave it empty", c.Forward.Source, c.Source)}
	}
	c.Forward.Source = c.Source
	if err := set("Sequencer", &c.Sequencer.Schema, &c.Sequencer.Pool); err != nil {
		return err
	}
	if c.WAL != nil {
		wal := *c.WAL // the caller's stays as it was
		if err := set("WAL", &wal.Schema, &wal.Pool); err != nil {
			return err
		}
		c.WAL = &wal
	}
	if err := set("Retention", &c.Retention.Schema, &c.Retention.Pool); err != nil {
		return err
	}
	c.followProfile()
	return nil
}

// followProfile gives the sequencer and the relay the pace of the
// forwarder's tuning profile (Forward.Subscriber.Tuning.AppendInterval: 2
// ms for LowLatency, 100 ms for Background) where they leave it zero, so
// that one profile sets the whole pipeline: the steps that bring messages
// into the log follow the pace of the reads that take them out. The
// vacuum keeps its own interval: no profile has one.
func (c *Config) followProfile() {
	pace := c.Forward.Subscriber.Tuning.AppendInterval()
	if pace <= 0 {
		return
	}
	if c.Sequencer.MinPassInterval == 0 {
		c.Sequencer.MinPassInterval = pace
	}
	if c.WAL != nil && c.WAL.MinAppendInterval == 0 {
		c.WAL.MinAppendInterval = pace
	}
}

// forwards reports whether the pipeline runs a Forwarder.
func (c Config) forwards() bool { return len(c.Forward.Topics) > 0 }

// Validate reports the first impossible setting as an *outboxtype.ConfigError
// (or *outboxtype.NameError), naming the field by its path in Config.
func (c Config) Validate() error {
	if c.Pool == nil {
		return &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	}
	if err := names.Schema(c.Schema); c.Schema != "" && err != nil {
		return err
	}
	if err := c.withSchema(); err != nil {
		return err
	}
	if c.DisableSequencer && c.WAL == nil && c.DisableRetention && !c.forwards() {
		return &outboxtype.ConfigError{Field: "Forward.Topics", Reason: "nothing to run: no sequencer, relay, vacuum or topic to forward"}
	}
	if c.forwards() {
		if err := prefix("Forward.", c.Forward.Validate()); err != nil {
			return err
		}
	} else if c.Forward.Target != nil {
		return &outboxtype.ConfigError{Field: "Forward.Topics", Reason: "a Target without Topics forwards nothing: name the outbox topics to forward"}
	}
	if !c.DisableSequencer {
		if err := prefix("Sequencer.", c.Sequencer.Validate()); err != nil {
			return err
		}
	}
	if c.WAL != nil {
		if err := prefix("WAL.", c.WAL.Validate()); err != nil {
			return err
		}
	}
	if !c.DisableRetention {
		if err := prefix("Retention.", c.Retention.Validate()); err != nil {
			return err
		}
	}
	return nil
}

// prefix puts path before the field of a *ConfigError.
func prefix(path string, err error) error {
	var ce *outboxtype.ConfigError
	if errors.As(err, &ce) && ce.Field != "" {
		return &outboxtype.ConfigError{Field: path + ce.Field, Reason: ce.Reason}
	}
	return err
}

// component is one long-running part of the pipeline.
type component struct {
	name  string
	run   func(context.Context) error
	close func() error
}

// Pipeline runs a schema's sequencer, relay, forwarder and vacuum. Create
// it with New, run it with Run, stop it with Close.
type Pipeline struct {
	cfg    Config
	logger watermill.LoggerAdapter
	life   startstop.Service

	sequencer *outbox.Sequencer
	relay     *relay.Relay
	forwarder *forwarder.Forwarder
	vacuum    *retention.Vacuum
	parts     []component
}

// New creates a Pipeline and its components; Run starts them.
func New(cfg Config, logger watermill.LoggerAdapter) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.withSchema(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Pipeline{cfg: cfg, logger: logger, life: startstop.Service{Name: "pipeline.Pipeline"}}
	var err error
	if !cfg.DisableSequencer {
		if p.sequencer, err = outbox.NewSequencer(cfg.Sequencer, logger); err != nil {
			return nil, err
		}
		p.parts = append(p.parts, component{"sequencer", p.sequencer.Run, p.sequencer.Close})
	}
	if cfg.WAL != nil {
		if p.relay, err = relay.New(*cfg.WAL, logger); err != nil {
			return nil, err
		}
		p.parts = append(p.parts, component{"relay", p.relay.Run, p.relay.Close})
	}
	if cfg.forwards() {
		if p.forwarder, err = forwarder.NewForwarder(cfg.Forward, logger); err != nil {
			return nil, err
		}
		p.parts = append(p.parts, component{"forwarder", p.forwarder.Run, p.forwarder.Close})
	}
	if !cfg.DisableRetention {
		if p.vacuum, err = retention.NewVacuum(cfg.Retention, logger); err != nil {
			return nil, err
		}
		p.parts = append(p.parts, component{"retention", p.vacuum.Run, p.vacuum.Close})
	}
	return p, nil
}

// Run runs every component until ctx ends or Close is called, and returns
// nil then. When one of them returns an error (a forwarder whose Kafka
// topic is missing, a schema never migrated) Run stops the others and
// returns it, naming the component. It runs once: a second Run while it
// runs is outbox.ErrAlreadyRunning, a Run after it stopped
// outbox.ErrClosed.
func (p *Pipeline) Run(ctx context.Context) error {
	if p == nil || p.parts == nil {
		return errs.NotConstructed("pipeline.Pipeline", "pipeline.New")
	}
	if ctx == nil {
		return fmt.Errorf("%w: pipeline.Pipeline.Run: nil context", sentinel.ErrInvalidArgument)
	}
	return p.life.Run(ctx, nil, p.run)
}

func (p *Pipeline) run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, c := range p.parts {
		wg.Go(func() {
			err := c.run(ctx)
			if err == nil {
				return
			}
			mu.Lock()
			if first == nil && ctx.Err() == nil {
				first = fmt.Errorf("pipeline: %s: %w", c.name, err)
				p.logger.Error("A component of the pipeline stopped; stopping the others", err, watermill.LogFields{"component": c.name})
			}
			mu.Unlock()
			stop()
		})
	}
	<-ctx.Done()
	// Each component stops on its context; Close makes it wait for its
	// sends in flight (CloseTimeout) and release its leases.
	for _, c := range p.parts {
		_ = c.close()
	}
	wg.Wait()
	return first
}

// Close stops the Pipeline and waits until Run has returned: every
// component is closed (the forwarder gives sends in flight the
// Subscriber's CloseTimeout, then releases its leases). Close does not
// close the Target or the Pool.
func (p *Pipeline) Close() error {
	if p == nil || p.parts == nil {
		return nil
	}
	p.life.Close()
	var errList []error
	for _, c := range p.parts {
		if err := c.close(); err != nil {
			errList = append(errList, fmt.Errorf("pipeline: close the %s: %w", c.name, err))
		}
	}
	return errors.Join(errList...)
}

// Stats are the running totals of the pipeline's components (zero for
// those it does not run).
type Stats struct {
	Sequencer outbox.SequencerStats
	Relay     relay.Stats
	Forwarder forwarder.Stats
	Retention retention.Stats
}

// Stats returns the components' running totals.
func (p *Pipeline) Stats() Stats {
	var s Stats
	if p == nil {
		return s
	}
	if p.sequencer != nil {
		s.Sequencer = p.sequencer.Stats()
	}
	if p.relay != nil {
		s.Relay = p.relay.Stats()
	}
	if p.forwarder != nil {
		s.Forwarder = p.forwarder.Stats()
	}
	if p.vacuum != nil {
		s.Retention = p.vacuum.Stats()
	}
	return s
}

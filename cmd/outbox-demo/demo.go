package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/pgtemp"
)

// demo is the state shared by the stages. Each stage registers what it
// starts with onClose; close stops it all, the latest first.
type demo struct {
	cfg    config
	out    io.Writer
	logger watermill.LoggerAdapter

	cluster   *pgtemp.Server
	pool      *pgxpool.Pool // publishers, sequencer, checks
	sequencer *outbox.Sequencer
	brokers   brokers    // Kafka and NATS
	forwarded forwarders // to Kafka and to NATS
	kafkaIn   *received  // what the broker-side consumers got
	natsIn    *received
	progress  *progress

	published    publishResult
	publishStart time.Time
	log          []logRow
	violations   violations

	quiet    atomic.Bool // set on interrupt: no more logging
	stopMu   sync.Mutex
	stoppers []func()
}

func newDemo(cfg config, out, logOut io.Writer) *demo {
	d := &demo{cfg: cfg, out: out}
	// Only warnings and errors: the sequencer and the forwarders log their
	// retries there.
	handler := slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn})
	d.logger = watermill.NewSlogLogger(slog.New(quietHandler{handler, &d.quiet}))
	return d
}

// quietHandler drops all records once quiet is set: after an interrupt,
// when everything fails on its way down.
type quietHandler struct {
	slog.Handler
	quiet *atomic.Bool
}

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return !h.quiet.Load() && h.Handler.Enabled(ctx, l)
}

func (h quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(attrs), h.quiet}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name), h.quiet}
}

// onClose registers stop to be called by close (latest registered first).
func (d *demo) onClose(stop func()) {
	d.stopMu.Lock()
	defer d.stopMu.Unlock()
	d.stoppers = append(d.stoppers, stop)
}

// stopAll stops everything the demo started but the PostgreSQL server, in
// reverse order: consumers, forwarders, sequencer, brokers, pools. Safe to
// call more than once and from several goroutines.
func (d *demo) stopAll() {
	for {
		d.stopMu.Lock()
		n := len(d.stoppers)
		if n == 0 {
			d.stopMu.Unlock()
			return
		}
		stop := d.stoppers[n-1]
		d.stoppers = d.stoppers[:n-1]
		d.stopMu.Unlock()
		stop()
	}
}

// close stops everything the demo started.
func (d *demo) close() {
	d.stopAll()
	if d.cluster != nil {
		d.cluster.Stop()
		d.cluster = nil
	}
}

// connect opens a pool of at most maxConns connections to the throwaway
// server.
func (d *demo) connect(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(d.cluster.URL("postgres"))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d.onClose(pool.Close)
	return pool, nil
}

// awaitSignalExit is called after an interrupt. Once the server runs,
// pgcluster's own signal handler stops it and exits the process (status
// 130) when it is gone. The brokers were stopped at the signal already
// (see startBrokers); stop the rest here. Stopping the server from here
// would return at once while the handler is at work, and exiting then would
// leave the server's directory behind, so give the handler time; the
// deferred close is the fallback should the signal have come before the
// handler was installed.
func (d *demo) awaitSignalExit() {
	d.stopAll()
	if d.cluster != nil {
		time.Sleep(20 * time.Second)
	}
}

package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// CollectorConfig configures NewCollector.
type CollectorConfig struct {
	// Pool is the database of the outbox. Required.
	Pool *pgxpool.Pool
	// Schema is the outbox schema (DefaultSchema when empty); every gauge
	// carries it as the label "schema".
	Schema string
	// Source, when set, names the database (a source of a
	// pipeline.Fleet): every gauge then carries it as the label "source",
	// so that one registry holds a collector per database. Collectors
	// with and without a source cannot share a registry (their label
	// names differ).
	Source string
	// Namespace prefixes the metric names (DefaultNamespace when empty).
	Namespace string
	// CollectInterval: see Config.CollectInterval.
	CollectInterval time.Duration
	// QueryTimeout bounds one collection (5 s when 0); a scrape that finds
	// the database slow gets the last figures and
	// outbox_collector_errors_total counts the failure.
	QueryTimeout time.Duration
}

// Collector is a prometheus.Collector of the figures only the database
// knows, for one schema. It queries at most once per CollectInterval (a
// fixed handful of statements in one read-only transaction, whatever the
// number of partitions) and serves the cached figures in between.
type Collector struct {
	cfg CollectorConfig
	q   *dbsql.Queries

	pending, pendingAge, lag, lagSeconds, degraded, backingOff, paused, leases, members *prometheus.Desc
	isolationFull, heldMessages, heldKeys, delayed                                      *prometheus.Desc
	deadLetters, retentionHeld, up, collectSeconds, errorsTotal                         *prometheus.Desc
	slotRetained, slotActive                                                            *prometheus.Desc

	mu      sync.Mutex
	last    time.Time
	metrics []prometheus.Metric
	took    time.Duration
	failed  float64
	ok      bool
}

// NewCollector creates the collector of cfg.Schema; register it with a
// prometheus.Registerer.
func NewCollector(cfg CollectorConfig) (*Collector, error) {
	if cfg.Pool == nil {
		return nil, &outboxtype.ConfigError{Field: "Pool", Reason: "required"}
	}
	if cfg.Schema == "" {
		cfg.Schema = names.DefaultSchema
	}
	if err := names.Schema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.CollectInterval == 0 {
		cfg.CollectInterval = DefaultCollectInterval
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 5 * time.Second
	}
	if cfg.CollectInterval < 0 || cfg.QueryTimeout < 0 {
		return nil, &outboxtype.ConfigError{Field: "CollectInterval/QueryTimeout", Reason: "must not be negative"}
	}
	constant := prometheus.Labels{"schema": cfg.Schema}
	if cfg.Source != "" {
		if err := names.Source(cfg.Source); err != nil {
			return nil, err
		}
		constant["source"] = cfg.Source
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(cfg.Namespace, "", name), help, labels, constant)
	}
	gt := []string{"group", "topic"}
	const (
		lagHelp = "Messages the consumer group has not finished: behind its cursors, and committed but not yet sequenced " +
			"(outbox_pending_messages of the topic, which every group has yet to handle, but for delayed messages whose time has not come and those of their keys behind them)."
		lagSecondsHelp = "Age of the oldest message the consumer group has not finished, one committed but not yet sequenced " +
			"included (0 when none): how late it is."
	)
	return &Collector{
		cfg:            cfg,
		q:              dbsql.For(cfg.Schema),
		pending:        desc("pending_messages", "Messages committed but not yet sequenced (0 for a registered topic with none).", "topic"),
		pendingAge:     desc("pending_oldest_age_seconds", "Age of the oldest message waiting for the sequencer that could be sequenced now, a delayed one counted from its time (0 when none): grows when no sequencer runs.", "topic"),
		delayed:        desc("delayed_messages", "Messages published with a delivery time (outbox.DeliverAt) that has not come: part of outbox_pending_messages, not of the lag.", "topic"),
		lag:            desc("lag_messages", lagHelp, gt...),
		lagSeconds:     desc("lag_seconds", lagSecondsHelp, gt...),
		degraded:       desc("partitions_degraded", "Partitions whose adaptive batching is degraded (isolating a failing message).", gt...),
		backingOff:     desc("partitions_backing_off", "Partitions waiting out a retry backoff.", gt...),
		paused:         desc("partitions_paused", "Partitions paused by an operator.", gt...),
		leases:         desc("leases_held", "Partitions with an unexpired lease.", gt...),
		members:        desc("live_members", "Members of the consumer group heard from within their lease TTL.", gt...),
		isolationFull:  desc("partitions_isolation_full", "Partitions blocking as without key isolation because their bounds on held keys or messages are reached.", gt...),
		heldMessages:   desc("held_messages", "Messages held back behind a failing message of their key (key isolation).", gt...),
		heldKeys:       desc("held_keys", "Keys held back because their first message fails (key isolation; a keyless message held counts as one).", gt...),
		deadLetters:    desc("dead_letters", "Dead letters by status: pending, replayed, discarded.", "group", "topic", "status"),
		retentionHeld:  desc("retention_held_messages", "Messages the retention vacuum keeps because of this group, the slowest on these partitions.", "topic", "group"),
		slotRetained:   desc("wal_slot_retained_bytes", "WAL PostgreSQL keeps for the log-based mode's replication slot (grows while no relay streams it); absent without a slot.", "slot"),
		slotActive:     desc("wal_slot_active", "1 while a relay streams the log-based mode's replication slot; absent without a slot.", "slot"),
		up:             desc("collector_up", "1 when the last collection succeeded."),
		collectSeconds: desc("collector_duration_seconds", "Duration of the last collection."),
		errorsTotal:    desc("collector_errors_total", "Failed collections."),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if ch == nil || c.q == nil { // nowhere to send, or a zero Collector (not made by NewCollector): nothing to describe
		return
	}
	for _, d := range []*prometheus.Desc{c.pending, c.pendingAge, c.delayed, c.lag, c.lagSeconds, c.degraded, c.backingOff, c.paused,
		c.leases, c.members, c.isolationFull, c.heldMessages, c.heldKeys, c.deadLetters, c.retentionHeld, c.slotRetained, c.slotActive, c.up, c.collectSeconds, c.errorsTotal} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if ch == nil || c.q == nil { // nowhere to send, or a zero Collector: nothing to collect
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last.IsZero() || time.Since(c.last) >= c.cfg.CollectInterval {
		c.refresh()
	}
	for _, m := range c.metrics {
		ch <- m
	}
	up := 0.0
	if c.ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.collectSeconds, prometheus.GaugeValue, c.took.Seconds())
	ch <- prometheus.MustNewConstMetric(c.errorsTotal, prometheus.CounterValue, c.failed)
}

// refresh queries the database; on failure the previous figures stay.
func (c *Collector) refresh() {
	start := time.Now()
	c.last = start
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.QueryTimeout)
	defer cancel()
	var out []prometheus.Metric
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}
	err := pgx.BeginTxFunc(ctx, c.cfg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, c.q.PendingMetrics)
		if err != nil {
			return err
		}
		var (
			topic, group, status string
			n, delayed, notYet   int64
			age                  float64
			nextDue              *time.Time
		)
		// Committed but not sequenced: every group of the topic has them
		// to handle, so they count in its lag too; not those that wait for
		// their time (delayed, and the later messages of their keys).
		type waiting struct {
			n   int64
			age float64
		}
		pending := map[string]waiting{}
		if _, err := pgx.ForEachRow(rows, []any{&topic, &n, &age, &delayed, &notYet, &nextDue}, func() error {
			gauge(c.pending, float64(n), topic)
			gauge(c.pendingAge, age, topic)
			gauge(c.delayed, float64(delayed), topic)
			pending[topic] = waiting{n - notYet, age}
			return nil
		}); err != nil {
			return err
		}
		var degraded, backingOff, paused, leases, members, full int32
		var heldMessages, heldKeys int64
		rows, err = tx.Query(ctx, c.q.CursorsMetrics)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&group, &topic, &n, &age, &degraded, &backingOff, &paused, &leases, &members, &full, &heldMessages, &heldKeys}, func() error {
			w := pending[topic]
			gauge(c.lag, float64(n+w.n), group, topic)
			gauge(c.lagSeconds, max(age, w.age), group, topic)
			gauge(c.degraded, float64(degraded), group, topic)
			gauge(c.backingOff, float64(backingOff), group, topic)
			gauge(c.paused, float64(paused), group, topic)
			gauge(c.leases, float64(leases), group, topic)
			gauge(c.members, float64(members), group, topic)
			gauge(c.isolationFull, float64(full), group, topic)
			gauge(c.heldMessages, float64(heldMessages), group, topic)
			gauge(c.heldKeys, float64(heldKeys), group, topic)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, c.q.DeadLettersMetrics)
		if err != nil {
			return err
		}
		if _, err := pgx.ForEachRow(rows, []any{&group, &topic, &status, &n}, func() error {
			gauge(c.deadLetters, float64(n), group, topic, status)
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, c.q.CursorsRetentionHolders)
		if err != nil {
			return err
		}
		var (
			parts            []int32
			oldest, activity time.Time
			heartbeat        *time.Time     // the vacuum's, for its join grace
			ttl              *time.Duration // likewise
		)
		if _, err = pgx.ForEachRow(rows, []any{&topic, &group, &parts, &n, &oldest, &activity, &members, &heartbeat, &ttl}, func() error {
			gauge(c.retentionHeld, float64(n), topic, group)
			return nil
		}); err != nil {
			return err
		}
		slot := dbsql.WALName(c.cfg.Schema)
		var (
			active            bool
			retained, ignored int64
			walStatus         string
			appended          int64
		)
		rows, err = tx.Query(ctx, c.q.WALSlotStatus, slot)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&active, &retained, &ignored, &walStatus, &appended}, func() error {
			gauge(c.slotRetained, float64(retained), slot)
			gauge(c.slotActive, map[bool]float64{true: 1}[active], slot)
			return nil
		})
		return err
	})
	c.took = time.Since(start)
	if err != nil {
		c.ok = false
		c.failed++
		return
	}
	c.ok, c.metrics = true, out
}

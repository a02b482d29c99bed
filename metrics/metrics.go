// Package metrics exports the outbox's Prometheus metrics: one call turns
// them on for every Publisher, Sequencer, Subscriber, Forwarder and
// retention Vacuum of the process.
//
//	m, err := metrics.Enable(metrics.Config{Registerer: prometheus.DefaultRegisterer, Pool: pool})
//	defer m.Disable()
//
// Events (messages published, sequencer passes, deliveries by outcome,
// handler durations, batch sizes, forwarder sends, retention deletes) are
// counted as they happen. Figures only the database knows (lag in
// messages and seconds, pending messages and the age of the oldest, dead
// letters by status, degraded, backing-off and paused partitions, leases
// held, live members, the group holding retention back) come from a
// collector that runs a fixed handful of queries at most once per
// CollectInterval, whatever the number of partitions, and serves the
// cached figures in between. docs/observability.md lists every metric and
// what it tells an operator.
//
// Until Enable is called the outbox reports nothing, and the cost is one
// atomic load per event. Enable may be called on several registries at
// once (a registry per exporter, a test's own next to the application's):
// every event reaches each of them, and Disable turns off only the
// registry it was returned for.
package metrics

import (
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/observe"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DefaultNamespace prefixes every metric name.
const DefaultNamespace = "outbox"

// DefaultCollectInterval is the default Config.CollectInterval.
const DefaultCollectInterval = 10 * time.Second

// Config configures Enable.
type Config struct {
	// Registerer is where the metrics are registered. Required.
	Registerer prometheus.Registerer
	// Namespace prefixes the metric names (DefaultNamespace when empty).
	Namespace string
	// Pool, when set, also registers the collector of the
	// database-derived gauges of Schema (DefaultSchema when empty). For
	// more schemas, register NewCollector for each.
	Pool   *pgxpool.Pool
	Schema string
	// CollectInterval is the most often the collector queries the database
	// (DefaultCollectInterval when 0); scrapes in between get the cached
	// figures.
	CollectInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Schema == "" {
		c.Schema = names.DefaultSchema
	}
	if c.CollectInterval == 0 {
		c.CollectInterval = DefaultCollectInterval
	}
}

// Validate reports the first impossible setting as an *outboxtype.ConfigError
// (or *outboxtype.NameError for a bad schema name).
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case c.Registerer == nil:
		return &outboxtype.ConfigError{Field: "Registerer", Reason: "required, e.g. prometheus.DefaultRegisterer"}
	case c.CollectInterval < 0:
		return &outboxtype.ConfigError{Field: "CollectInterval", Reason: "must not be negative"}
	}
	if c.Pool != nil {
		return names.Schema(c.Schema)
	}
	return nil
}

// Metrics are the outbox's event metrics of one registry, registered and
// added to the process's observers by Enable.
type Metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector
	remove     func() // uninstalls this Metrics' observer, and no other
	disable    sync.Once

	published, publishedBytes                *prometheus.CounterVec
	passes, passRows                         prometheus.Counter
	passDuration                             prometheus.Histogram
	sequencingDelay                          *prometheus.HistogramVec
	deliveries                               *prometheus.CounterVec
	handlerDuration, batchSize               *prometheus.HistogramVec
	retentionDeleted                         *prometheus.CounterVec
	forwarded, forwardedBytes, forwardErrors *prometheus.CounterVec
	forwardDuration                          *prometheus.HistogramVec
	kafkaTransactionBatches                  prometheus.Histogram
	sourceUp                                 *prometheus.GaugeVec

	// The per group and topic series of the delivery path, resolved once:
	// label lookups cost more than the increments.
	groupsMu sync.RWMutex
	groups   map[groupTopic]*groupSeries
	// forwardTopics are the forwarder sources and topics whose series
	// exist.
	forwardTopics sync.Map
}

type groupTopic struct{ group, topic string }

type groupSeries struct {
	outcomes        map[observe.Outcome]prometheus.Counter
	handlerDuration prometheus.Observer
	batchSize       prometheus.Observer
}

// series returns the delivery series of group and topic.
func (m *Metrics) series(group, topic string) *groupSeries {
	key := groupTopic{group, topic}
	m.groupsMu.RLock()
	gs := m.groups[key]
	m.groupsMu.RUnlock()
	if gs != nil {
		return gs
	}
	m.groupsMu.Lock()
	defer m.groupsMu.Unlock()
	if gs = m.groups[key]; gs != nil {
		return gs
	}
	gs = &groupSeries{
		outcomes:        map[observe.Outcome]prometheus.Counter{},
		handlerDuration: m.handlerDuration.WithLabelValues(group, topic),
		batchSize:       m.batchSize.WithLabelValues(group, topic),
	}
	for _, o := range []observe.Outcome{observe.Ack, observe.Nack, observe.Reject, observe.Timeout, observe.Crash} {
		gs.outcomes[o] = m.deliveries.WithLabelValues(group, topic, string(o))
	}
	m.groups[key] = gs
	return gs
}

// Enable registers the metrics on cfg.Registerer and makes every outbox
// component of the process report to them, in addition to any other
// registry enabled before (each gets every event). Call Disable to stop.
// Enabling a registry that has the outbox metrics already is refused with
// an *outboxtype.ConfigError.
func Enable(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	ns := cfg.Namespace
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
	}
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &Metrics{
		reg:            cfg.Registerer,
		groups:         map[groupTopic]*groupSeries{},
		published:      counter("published_messages_total", "Messages written by Publishers (in their callers' transactions, which may still roll back).", "topic"),
		publishedBytes: counter("published_bytes_total", "Bytes of payload, metadata, uuids and keys written by Publishers.", "topic"),
		passes:         prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "sequencer_passes_total", Help: "Sequencer passes that moved messages into the log."}),
		passRows:       prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "sequencer_rows_total", Help: "Messages the sequencer gave a seq."}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "sequencer_pass_duration_seconds",
			Help: "Duration of sequencer passes that moved messages.", Buckets: latency}),
		sequencingDelay: histogram("sequencing_delay_seconds",
			"Per sequencer pass and topic, the time from the INSERT of the oldest message moved (from its delivery time, for a delayed one) to its seq: an upper bound of the commit-to-seq delay of every message of the pass.", latency, "topic"),
		deliveries: counter("deliveries_total",
			"Deliveries to consumer groups by outcome: ack, nack, reject, timeout, crash (ended without an outcome, counted as a failed attempt by the next lease holder).", "group", "topic", "outcome"),
		handlerDuration:  histogram("handler_duration_seconds", "Duration of handler calls (one message, or a whole batch for ConsumeBatches).", latency, "group", "topic"),
		batchSize:        histogram("batch_size", "Messages per batch read by partition workers.", prometheus.ExponentialBuckets(1, 2, 12), "group", "topic"),
		retentionDeleted: counter("retention_deleted_rows_total", "Log rows deleted by the retention vacuum.", "topic"),
		forwarded:        counter("forwarder_records_total", "Messages the broker confirmed, per source (database; empty unless named) and target topic.", "source", "topic"),
		forwardedBytes:   counter("forwarder_bytes_total", "Bytes (payload and headers) the broker confirmed, per source and target topic.", "source", "topic"),
		forwardErrors:    counter("forwarder_errors_total", "Failed forwarder sends by kind: poison, timeout, partial, broker.", "source", "topic", "kind"),
		forwardDuration:  histogram("forwarder_send_duration_seconds", "Duration of forwarder sends, per source and target topic.", latency, "source", "topic"),
		kafkaTransactionBatches: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "forwarder_kafka_transaction_batches",
			Help: "Outbox partitions' batches per committed Kafka transaction of the exactly-once Kafka target (its count: the transactions).", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		sourceUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "source_up",
			Help: "1 when a pipeline.Fleet reached the source's database at its last check, 0 when it did not (its partitions are not forwarded meanwhile)."}, []string{"source"}),
	}
	m.collectors = []prometheus.Collector{m.published, m.publishedBytes, m.passes, m.passRows, m.passDuration, m.sequencingDelay,
		m.deliveries, m.handlerDuration, m.batchSize, m.retentionDeleted, m.forwarded, m.forwardedBytes, m.forwardErrors, m.forwardDuration, m.kafkaTransactionBatches, m.sourceUp}
	if cfg.Pool != nil {
		c, err := NewCollector(CollectorConfig{Pool: cfg.Pool, Schema: cfg.Schema, Namespace: ns,
			CollectInterval: cfg.CollectInterval})
		if err != nil {
			return nil, err
		}
		m.collectors = append(m.collectors, c)
	}
	for i, c := range m.collectors {
		if err := cfg.Registerer.Register(c); err != nil {
			for _, r := range m.collectors[:i] {
				cfg.Registerer.Unregister(r)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, &outboxtype.ConfigError{Field: "Registerer", Reason: "the outbox metrics are registered on it already: call Enable once per registry (Disable first to enable again)"}
			}
			return nil, err
		}
	}
	m.remove = observe.Add(observer{m})
	return m, nil
}

// Disable stops reporting to this Metrics' registry and unregisters the
// metrics from it; other registries enabled keep theirs. Calling it again
// does nothing.
func (m *Metrics) Disable() {
	if m.remove == nil { // a zero Metrics (not made by Enable): nothing enabled
		return
	}
	m.disable.Do(func() {
		m.remove()
		for _, c := range m.collectors {
			m.reg.Unregister(c)
		}
	})
}

// observer is what the components report to.
type observer struct{ m *Metrics }

func (o observer) Published(topic string, messages, bytes int) {
	o.m.published.WithLabelValues(topic).Add(float64(messages))
	o.m.publishedBytes.WithLabelValues(topic).Add(float64(bytes))
}

func (o observer) SequencerPass(rows int, took time.Duration, oldest map[string]time.Duration) {
	o.m.passes.Inc()
	o.m.passRows.Add(float64(rows))
	o.m.passDuration.Observe(took.Seconds())
	for topic, age := range oldest {
		o.m.sequencingDelay.WithLabelValues(topic).Observe(age.Seconds())
	}
}

func (o observer) Delivered(group, topic string, outcome observe.Outcome, n int, took time.Duration) {
	gs := o.m.series(group, topic)
	if c := gs.outcomes[outcome]; c != nil {
		c.Add(float64(n))
	}
	if took > 0 {
		gs.handlerDuration.Observe(took.Seconds())
	}
}

func (o observer) Crashed(group, topic string, n int) {
	o.m.series(group, topic).outcomes[observe.Crash].Add(float64(n))
}

func (o observer) Batch(group, topic string, size int) {
	o.m.series(group, topic).batchSize.Observe(float64(size))
}

func (o observer) RetentionDeleted(topic string, rows int64) {
	o.m.retentionDeleted.WithLabelValues(topic).Add(float64(rows))
}

// forwardErrorKinds are the kinds of outbox_forwarder_errors_total, each
// exported at 0 from the forwarder's start, so that an alert on its
// increase sees the first error.
var forwardErrorKinds = []string{"poison", "timeout", "partial", "broker"}

func (o observer) Forwarding(source, topic string) {
	if _, seen := o.m.forwardTopics.LoadOrStore([2]string{source, topic}, true); seen {
		return
	}
	o.m.forwarded.WithLabelValues(source, topic)
	o.m.forwardedBytes.WithLabelValues(source, topic)
	o.m.forwardDuration.WithLabelValues(source, topic)
	for _, kind := range forwardErrorKinds {
		o.m.forwardErrors.WithLabelValues(source, topic, kind)
	}
}

func (o observer) Forwarded(source, topic string, sent, bytes int, took time.Duration, errKind string) {
	o.Forwarding(source, topic) // enabled after the forwarder started
	o.m.forwarded.WithLabelValues(source, topic).Add(float64(sent))
	o.m.forwardedBytes.WithLabelValues(source, topic).Add(float64(bytes))
	o.m.forwardDuration.WithLabelValues(source, topic).Observe(took.Seconds())
	if errKind != "" {
		o.m.forwardErrors.WithLabelValues(source, topic, errKind).Inc()
	}
}

func (o observer) KafkaTransaction(batches int) {
	o.m.kafkaTransactionBatches.Observe(float64(batches))
}

func (o observer) SourceUp(source string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	o.m.sourceUp.WithLabelValues(source).Set(v)
}

// SourceRemoved deletes the source's up gauge; its forwarder counters stay
// (a counter that vanished would read as a reset to rate()).
func (o observer) SourceRemoved(source string) {
	o.m.sourceUp.DeleteLabelValues(source)
}

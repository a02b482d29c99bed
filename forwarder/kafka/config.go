// Package kafka is the Kafka target of a forwarder (package forwarder): it
// writes outbox messages into Kafka through franz-go's kgo client, exactly
// once by default, as records a watermill-kafka Subscriber reads unchanged.
//
//	target, err := kafka.NewTarget(kafka.Config{Brokers: []string{"kafka:9092"}}, logger)
//	defer target.Close()
//	fwd, err := forwarder.NewForwarder(forwarder.Config{
//		Subscriber: outbox.SubscriberConfig{Pool: pool, RejectHandler: deadLetters},
//		Topics:     []string{"orders"},
//		Target:     target,
//	}, logger)
//
// Exactly once (the default): every outbox partition writes through a kgo
// transactional producer of its own (transactional.id
// "<prefix>/<schema>/<group>/<topic>/<partition>", with the forwarder's
// source after the prefix when it has one), one Kafka transaction
// per batch. When an instance (re)gains a partition, the producer's
// InitProducerId fences every earlier owner of it (a zombie included), and
// a read_committed read of the target partition's tail finds the last
// message the partition committed, which is skipped when the cursor hands
// it out again. Consumers read with isolation level read_committed. See
// Config.AtLeastOnce, and docs/forwarder.md for the details and what the
// tests prove.
package kafka

import (
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Defaults of Config.
const (
	DefaultTransactionalIDPrefix = "watermill-outbox"
	DefaultTransactionTimeout    = time.Minute
	DefaultTailScanLimit         = 100_000
	DefaultMaxBatchBytes         = 1_000_012 // kgo's, and Kafka's message.max.bytes default
	DefaultProducerIdleTimeout   = 2 * time.Minute
	DefaultRecordRetries         = 3
)

// Config configures a Target. The zero value of every field but Brokers is
// its default.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// ClientOptions are extra franz-go options applied to every client the
	// target creates (the at-least-once producer, the exactly-once
	// producers, the admin and tail-read clients): TLS (kgo.DialTLSConfig),
	// SASL, kgo.ClientID, kgo.ProducerBatchCompression, timeouts,
	// kgo.WithLogger, kgo.Dialer….
	//
	// The target's own defaults come before them, so these override them:
	// kgo.ClientID("watermill-outbox-forwarder"), kgo.DialTimeout(5 s),
	// kgo.ProducerBatchCompression(kgo.NoCompression()) (as Kafka's Java
	// client and sarama; kgo's own default is snappy),
	// kgo.RecordRetries(DefaultRecordRetries) (a record that failed that
	// often fails its Send, which the forwarder retries with backoff; kgo's
	// own default retries forever) and kgo.ProducerLinger(0).
	//
	// The target sets these after them, so they cannot be changed here:
	// kgo.SeedBrokers (Brokers), kgo.RecordPartitioner (Partitioner),
	// kgo.ProducerBatchMaxBytes (MaxBatchBytes); exactly once,
	// kgo.TransactionalID and kgo.TransactionTimeout (TransactionalIDPrefix,
	// TransactionTimeout) and kgo.RequiredAcks(kgo.AllISRAcks()); at least
	// once, kgo.AllowIdempotentProduceCancellation (a send ends at its
	// deadline); for the tail read, kgo.ConsumePartitions,
	// kgo.FetchIsolationLevel(kgo.ReadCommitted()) and
	// kgo.KeepControlRecords.
	ClientOptions []kgo.Opt
	// Marshaler builds the Kafka records. Default DefaultMarshaler, so that
	// watermill-kafka subscribers read them as usual.
	Marshaler Marshaler
	// Key returns the record key of a message. Default: the key the message
	// was published to the outbox with (forwarder.PartitionKey). An empty
	// key makes the record keyless.
	Key func(msg *message.Message) []byte
	// CloudEvents sends each message as a CloudEvent 1.0 of the Kafka
	// protocol binding (forwarder.CloudEvents; off by default). Binary
	// mode: the record's value is the data, the attributes are headers
	// ce_specversion, ce_id, ce_source, ce_type, ce_time, ce_subject (the
	// record key) and content-type (datacontenttype), next to the
	// Marshaler's headers. Structured mode: the value is the event in the
	// JSON event format, header content-type
	// "application/cloudevents+json", the Marshaler's headers kept. In
	// both, the outbox_* headers stay (the exactly-once tail read finds
	// the records by them) and a tombstone goes in binary mode: a record
	// with a null value and the ce_ headers.
	CloudEvents forwarder.CloudEvents

	// AtLeastOnce turns exactly-once delivery off: an idempotent kgo
	// producer per outbox partition, no transactions; copies are then
	// possible after a crash or a takeover, each with the same outbox_id
	// header. Turn it off for clusters that do not allow transactions
	// (ACLs) or consumers that cannot read committed. Every forwarder of a
	// group must use the same mode.
	AtLeastOnce bool
	// TransactionalIDPrefix starts the transactional.id of the target's
	// exactly-once producer, "<prefix>/<instance>" (a random instance id
	// per Target: one producer sends for every outbox partition the
	// instance holds; see exactly_once.go), and the ids of the
	// at-least-once producers, "at-least-once:<prefix>/<schema>/<group>/<topic>/<partition>"
	// ("<prefix>/source=<source>/<schema>/…" for a Forwarder with a source,
	// forwarder.Config.Source). Default DefaultTransactionalIDPrefix. Grant
	// the forwarders' principal transactional-id ACLs on this prefix. Two
	// outbox databases whose forwarders write to one Kafka cluster must
	// name their sources (a pipeline.Fleet does): with equal schema,
	// group and topic names each would take the other's records for its
	// own when it reads the tail back.
	TransactionalIDPrefix string
	// TransactionTimeout is the transaction.timeout.ms of the producers
	// (default DefaultTransactionTimeout, at least a second; at most the
	// brokers' transaction.max.timeout.ms). A transaction a forwarder leaves
	// open when it dies holds read_committed consumers of its Kafka
	// partitions back until the partition's next owner starts (its
	// InitProducerId aborts it) or this timeout passes.
	TransactionTimeout time.Duration
	// TailScanLimit bounds, per Kafka partition, how many records the
	// target reads back to find the last record of an outbox partition when
	// it (re)gains it (default DefaultTailScanLimit). With equal partition
	// counts the last record is at the very end; with unequal counts it may
	// be further back, and past this limit a message may be sent twice.
	TailScanLimit int
	// MaxBatchBytes is the largest record batch the target builds
	// (kgo.ProducerBatchMaxBytes; default DefaultMaxBatchBytes, between 512
	// and 1 GiB). Keep it at most the brokers' message.max.bytes (the
	// topic's max.message.bytes). A record larger than it is rejected
	// (outbox.Reject) without being sent.
	MaxBatchBytes int
	// ProducerIdleTimeout closes an at-least-once partition producer (a
	// kgo client, its connections and goroutines) that sent nothing for
	// this long: the partition went to another instance, or it is quiet;
	// its next batch opens a new one. Default DefaultProducerIdleTimeout.
	// It bounds the clients of an instance by the outbox partitions it sent
	// to within the timeout. (Exactly once, one producer sends for every
	// partition.)
	ProducerIdleTimeout time.Duration
	// Linger is how long a round of the exactly-once producer waits for
	// the batches of other partitions before its transaction starts. 0 (the
	// default) waits for nothing: a batch that finds no round in flight
	// goes at once, and the batches that arrive while one is in flight go
	// together in the next, so transactions grow with the load by
	// themselves. A few milliseconds trade latency for fewer transactions
	// at moderate load. At most a second.
	Linger time.Duration
	// CreateTopics lets the forwarder create a destination topic that does
	// not exist when it starts (Target.CheckTopic), with as many partitions
	// as its outbox topic and the brokers' default replication factor.
	// Off by default: a missing topic stops Forwarder.Run with
	// ErrNoSuchTopic, saying what to create, rather than retrying sends
	// for ever.
	CreateTopics bool
}

func (c *Config) setDefaults() {
	if c.Marshaler == nil {
		c.Marshaler = DefaultMarshaler{}
	}
	if c.Key == nil {
		c.Key = defaultKey
	}
	if c.TransactionalIDPrefix == "" {
		c.TransactionalIDPrefix = DefaultTransactionalIDPrefix
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.TailScanLimit == 0 {
		c.TailScanLimit = DefaultTailScanLimit
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.ProducerIdleTimeout == 0 {
		c.ProducerIdleTimeout = DefaultProducerIdleTimeout
	}
}

func defaultKey(msg *message.Message) []byte {
	if k := forwarder.PartitionKey(msg); k != "" {
		return []byte(k)
	}
	return nil
}

// Validate reports the first impossible setting as an *outboxtype.ConfigError.
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case len(c.Brokers) == 0:
		return &outboxtype.ConfigError{Field: "Brokers", Reason: "required"}
	case c.TransactionTimeout < time.Second:
		return &outboxtype.ConfigError{Field: "TransactionTimeout", Reason: "must be at least a second"}
	case c.TailScanLimit < 0:
		return &outboxtype.ConfigError{Field: "TailScanLimit", Reason: "must be positive"}
	case c.MaxBatchBytes < 512 || c.MaxBatchBytes > 1<<30:
		return &outboxtype.ConfigError{Field: "MaxBatchBytes", Reason: "must be between 512 bytes and 1 GiB"}
	case c.ProducerIdleTimeout < 0:
		return &outboxtype.ConfigError{Field: "ProducerIdleTimeout", Reason: "must be positive"}
	case c.Linger < 0 || c.Linger > time.Second:
		return &outboxtype.ConfigError{Field: "Linger", Reason: "must be between 0 and a second"}
	}
	if err := c.CloudEvents.Validate(); err != nil {
		return err
	}
	for i, b := range c.Brokers {
		if b == "" {
			return &outboxtype.ConfigError{Field: "Brokers", Reason: "entry " + itoa(i) + " is empty"}
		}
	}
	for i, o := range c.ClientOptions {
		if o == nil {
			return &outboxtype.ConfigError{Field: "ClientOptions", Reason: "entry " + itoa(i) + " is nil"}
		}
	}
	// kgo validates the combination of options when a client is made:
	// make one (it connects only when used) to report a bad option now.
	extra := []kgo.Opt{kgo.AllowIdempotentProduceCancellation()}
	if !c.AtLeastOnce {
		extra = c.transactional(c.TransactionalIDPrefix)
	}
	cl, err := newClient(c.clientOptions(extra))
	if err != nil {
		return &outboxtype.ConfigError{Field: "ClientOptions", Reason: err.Error()}
	}
	cl.Close()
	return nil
}

// clientOptions returns the options of a client of the target: its
// defaults, ClientOptions, then what the target needs (extra).
func (c *Config) clientOptions(extra []kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ClientID("watermill-outbox-forwarder"),
		kgo.DialTimeout(5 * time.Second),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RecordRetries(DefaultRecordRetries),
		kgo.ProducerLinger(0),
	}
	opts = append(opts, c.ClientOptions...)
	opts = append(opts,
		kgo.SeedBrokers(c.Brokers...),
		kgo.RecordPartitioner(Partitioner()),
		kgo.ProducerBatchMaxBytes(int32(c.MaxBatchBytes)),
	)
	return append(opts, extra...)
}

// transactional returns the options of the exactly-once producer of
// transactional id id.
func (c *Config) transactional(id string) []kgo.Opt {
	return []kgo.Opt{
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(c.TransactionTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func newClient(opts []kgo.Opt) (*kgo.Client, error) { return kafkadriver.NewClient(opts) }

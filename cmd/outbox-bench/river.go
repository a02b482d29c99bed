package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	outbox "github.com/millrace/watermill-outbox"
)

// sysRiver is River used as an outbox: the job is inserted in the business
// transaction (InsertManyFastTx, River's bulk insert), and River workers
// produce each job's message to Kafka.
const sysRiver = "river"

// riverOutboxArgs is the job of (d): one message to produce.
type riverOutboxArgs struct {
	UUID     string            `json:"uuid"`
	Key      string            `json:"key,omitempty"`
	Metadata map[string]string `json:"metadata"`
	Payload  []byte            `json:"payload"`
}

// Kind names the job kind.
func (riverOutboxArgs) Kind() string { return "outbox_message" }

// riverOutboxWorker produces a job's message with watermill-kafka's
// publisher (a sarama SyncProducer), keyed by the partition key, as (b)
// does.
type riverOutboxWorker struct {
	river.WorkerDefaults[riverOutboxArgs]
	topic string
	pub   message.Publisher
}

// Work produces the message; an error makes River retry the job.
func (w *riverOutboxWorker) Work(ctx context.Context, job *river.Job[riverOutboxArgs]) error {
	m := message.NewMessage(job.Args.UUID, job.Args.Payload)
	for k, v := range job.Args.Metadata {
		m.Metadata.Set(k, v)
	}
	m.SetContext(ctx)
	return w.pub.Publish(w.topic, m)
}

// riverWorkers is the workers per River client: River's MaxWorkers for the
// default queue, as its docs advise raising for I/O-bound jobs.
const riverWorkers = 100

// setupRiver creates (d), configured as River's docs recommend for
// throughput: its tables migrated into the schema (rivermigrate), jobs
// inserted with InsertManyFastTx (COPY) in the caller's transaction, one
// client with 100 workers on the default queue, FetchCooldown 1 ms (its
// minimum; the default 100 ms caps throughput, as its docs say) and
// FetchPollInterval 50 ms as a fallback to its LISTEN/NOTIFY insert
// notifications. River does not keep any order per key: jobs run
// concurrently, so records of one key can reach Kafka out of order.
func (b *bench) setupRiver(ctx context.Context, schema, kafkaTopic string, brokers []string) (*system, error) {
	pool, err := b.pool(ctx, 2*riverWorkers/10+8)
	if err != nil {
		return nil, err
	}
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		pool.Close()
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	kp, err := newKafkaPublisher(brokers)
	if err != nil {
		pool.Close()
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverOutboxWorker{topic: kafkaTopic, pub: kp})
	// The inserting client: no queues, so it only inserts.
	inserter, err := river.NewClient(driver, &river.Config{Schema: schema})
	if err != nil {
		_ = kp.Close()
		pool.Close()
		return nil, err
	}
	var worker *river.Client[pgx.Tx]
	sys := &system{kafkaTopic: kafkaTopic}
	sys.start = func(ctx context.Context) error {
		c, err := river.NewClient(driver, &river.Config{
			Schema:            schema,
			Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverWorkers}},
			Workers:           workers,
			FetchCooldown:     time.Millisecond,
			FetchPollInterval: 50 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		if err := c.Start(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("river: %w", err)
		}
		worker = c
		return nil
	}
	sys.stop = func() {
		if worker != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = worker.Stop(stopCtx)
			cancel()
		}
		_ = kp.Close()
		pool.Close()
	}
	sys.publish = func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		params := make([]river.InsertManyParams, len(msgs))
		for i, m := range msgs {
			params[i] = river.InsertManyParams{Args: riverOutboxArgs{
				UUID: m.UUID, Key: m.Metadata.Get(outbox.PublishPartitionKeyMetadata), Metadata: m.Metadata, Payload: m.Payload,
			}}
		}
		_, err := inserter.InsertManyFastTx(ctx, tx, params)
		return err
	}
	return sys, nil
}

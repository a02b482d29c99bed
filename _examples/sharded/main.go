// Command sharded shows a sharded application whose three PostgreSQL
// databases, "eu", "us" and "apac", each with its own outbox, are
// forwarded by one process into one Kafka topic, exactly once, with a
// pipeline.Fleet (issue 31).
//
//	go run ./_examples/sharded
//
// The application routes each customer to a shard by a stable hash of its
// key and writes the customer's orders, with their OrderPlaced events, in
// that shard's database. One Fleet runs a pipeline per database; the third
// shard joins while the fleet runs. The Kafka topic is then read back
// (read_committed) and checked: every order once, in order per customer,
// each record naming the shard it came from in its outbox_source header.
// Two databases number their messages alike, so the same outbox_id arrives
// from several shards: (outbox_source, outbox_id) is what tells records
// apart.
//
// No setup: the databases are three throwaway PostgreSQL servers, Kafka an
// in-process fake cluster (franz-go's kfake). The last line printed is OK.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/_examples/internal/exampledb"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/pipeline"
)

const (
	// partitions is the partition count of topic "orders" in every
	// shard's outbox and in Kafka: equal counts put a key on the same
	// partition number in both.
	partitions   = 4
	customers    = 30
	ordersEach   = 10 // per customer
	totalOrders  = customers * ordersEach
	kafkaTopic   = "orders"       // the outbox topic's name (forwarder.Config's default TargetTopic)
	publishFirst = ordersEach / 2 // orders per customer placed before "apac" joins the fleet
)

// shards are the application's databases, by the index shardOf returns.
// The names are the Fleet's source names: they end up in every record's
// outbox_source header and in the Kafka transactional ids, so they must
// not change once a shard forwards.
var shards = []string{"eu", "us", "apac"}

// shardOf routes a customer to its shard. This is the rule per-key order
// depends on: same key → same shard → same outbox partition → same Kafka
// partition. The outbox orders a key's messages within one database only;
// a key whose messages were written to two shards would reach Kafka from
// two pipelines, in no particular order between them. So the routing must
// be stable: the same in every process and every release (FNV-1a is; Go's
// map hash and hash/maphash are seeded per process), and changing it, or
// the number of shards, moves keys between shards: a migration, not a
// deployment. It hashes unlike the outbox's partitioning (murmur2): with
// the same hash, two shards and four partitions, each shard's keys would
// land on two of its partitions only.
func shardOf(customer string) int {
	h := fnv.New32a()
	h.Write([]byte(customer))
	return int(h.Sum32() % uint32(len(shards)))
}

func main() { exampledb.Main(run) }

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	began := time.Now()
	logger := exampledb.Logger()

	// Three databases, each a PostgreSQL server of its own, as shards are.
	// A throwaway server costs about a second (initdb, start, migrate):
	// started side by side, the three take about two seconds on two cores,
	// most of this example's run time.
	dbs, err := startShards(ctx)
	if err != nil {
		return err
	}
	defer func() {
		for _, db := range dbs {
			db.Stop()
		}
	}()
	for _, db := range dbs {
		// The same schema and topic in every shard, with the same
		// partition count (and the same as Kafka's).
		if err := outbox.RegisterTopic(ctx, db.Pool, outbox.DefaultSchema, "orders", partitions); err != nil {
			return err
		}
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE orders (customer text NOT NULL, n integer NOT NULL, PRIMARY KEY (customer, n))`); err != nil {
			return err
		}
	}
	source := func(i int) pipeline.Source { return pipeline.Source{Name: shards[i], Pool: dbs[i].Pool} }

	// Kafka: one in-process broker with the topic, as many partitions as
	// the outbox topics.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, kafkaTopic))
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	// One Target for every shard: it puts each source's name in its
	// transactional ids, so that the shards' producers of "orders"
	// partition 0 do not fence one another, and reads back only its own
	// source's records when it (re)gains a partition.
	target, err := kafka.NewTarget(kafka.Config{Brokers: brokers}, logger)
	if err != nil {
		return err
	}
	defer target.Close()

	// The Fleet: one pipeline (sequencer, forwarder, vacuum) per shard,
	// all with the same configuration but their database. "apac" is not
	// among them yet: it joins below, while the fleet runs. A source's
	// dead letters go to its own database's dead_letters table (the
	// pipeline's default), which is why no RejectHandler is set here: the
	// configuration is shared by every source.
	fleet, err := pipeline.NewFleet(pipeline.FleetConfig{
		Sources: []pipeline.Source{source(0), source(1)},
		Pipeline: pipeline.Config{
			Forward: forwarder.Config{Topics: []string{"orders"}, Target: target},
		},
	}, logger)
	if err != nil {
		return err
	}
	var fleetErr error
	fleetDone := make(chan struct{})
	go func() { fleetErr = fleet.Run(ctx); close(fleetDone) }()
	stopFleet := func() error { // Close returns once Run has; again, at once
		_ = fleet.Close()
		<-fleetDone
		return fleetErr
	}
	defer stopFleet()

	// The application: each order and its event in one transaction of the
	// customer's shard. One Publisher serves every shard: the transaction
	// in the message's context is the database it writes to.
	pub, err := outbox.NewPublisher(outbox.PublisherConfig{}, logger)
	if err != nil {
		return err
	}
	perShard := make([]int, len(shards))
	place := func(from, to int) error {
		for n := from; n <= to; n++ {
			for c := range customers {
				customer := fmt.Sprintf("customer-%02d", c)
				shard := shardOf(customer)
				if err := placeOrder(ctx, dbs[shard], pub, customer, n); err != nil {
					return fmt.Errorf("shard %s: %w", shards[shard], err)
				}
				perShard[shard]++
			}
		}
		return nil
	}
	if err := place(1, publishFirst); err != nil {
		return err
	}

	// A shard joins the running fleet: its pipeline starts at once and
	// forwards what its outbox holds (the orders above) and what follows.
	if err := fleet.Add(source(2)); err != nil {
		return err
	}
	if err := place(publishFirst+1, ordersEach); err != nil {
		return err
	}
	fmt.Printf("placed %d orders of %d customers:", totalOrders, customers)
	for i, n := range perShard {
		fmt.Printf(" %s %d", shards[i], n)
	}
	fmt.Println()

	// Read the topic back as a consumer would: read_committed, since the
	// target writes in Kafka transactions.
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafkaTopic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// The transaction markers too: they occupy offsets, and the last
		// offset of a partition is usually one, which is how the read
		// below knows it got to the end.
		kgo.KeepControlRecords())
	if err != nil {
		return err
	}
	defer client.Close()
	var read reading
	// First until every order has arrived (the fleet forwards as the
	// orders commit)...
	if err := read.until(ctx, client, func() bool { return len(read.records) >= totalOrders }); err != nil {
		return fmt.Errorf("%d of %d orders arrived in Kafka: %w", len(read.records), totalOrders, err)
	}
	// The fleet's own account: each source's pipeline counts the messages
	// Kafka confirmed (a moment after a consumer may read them).
	status, err := forwarded(ctx, fleet, totalOrders)
	if err != nil {
		return err
	}
	// ...then, with the fleet stopped, to the end of every partition: a
	// copy of an order would be there.
	if err := stopFleet(); err != nil {
		return err
	}
	ends, err := kadm.NewClient(client).ListEndOffsets(ctx, kafkaTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return err
	}
	if err := read.until(ctx, client, func() bool {
		done := true
		ends.Each(func(o kadm.ListedOffset) { done = done && read.next[o.Partition] >= o.Offset })
		return done
	}); err != nil {
		return fmt.Errorf("reading Kafka to its end: %w", err)
	}

	if err := check(read.records); err != nil {
		return err
	}
	fmt.Printf("all %d orders read from Kafka once each, in order per customer, each from its customer's shard (outbox_source) and on the Kafka partition of its outbox partition\n", len(read.records))
	id, from := collision(read.records)
	if len(from) < 2 {
		return fmt.Errorf("no outbox id arrived from two shards: %s from %v only", id, from)
	}
	fmt.Printf("outbox ids collide across shards: %s came from %s; (outbox_source, outbox_id) tells them apart\n", id, strings.Join(from, ", "))
	fmt.Println("fleet.Status():")
	for _, s := range status {
		fmt.Printf("  %-4s %-8s forwarded %3d messages in %2d batches, %d restarts\n",
			s.Name, s.State, s.Stats.Forwarder.Messages, s.Stats.Forwarder.Batches, s.Restarts)
	}
	fmt.Printf("took %v\n", time.Since(began).Round(100*time.Millisecond))
	return nil
}

// forwarded waits until the fleet's sources have forwarded n messages in
// all, and returns their status.
func forwarded(ctx context.Context, fleet *pipeline.Fleet, n int64) ([]pipeline.SourceStatus, error) {
	for {
		status, sum := fleet.Status(), int64(0)
		for _, s := range status {
			sum += s.Stats.Forwarder.Messages
		}
		if sum >= n {
			return status, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the fleet forwarded %d messages of %d: %w", sum, n, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// startShards starts a throwaway database per shard, side by side.
func startShards(ctx context.Context) ([]*exampledb.DB, error) {
	dbs := make([]*exampledb.DB, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i := range shards {
		wg.Go(func() { dbs[i], errs[i] = exampledb.Start(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for _, db := range dbs {
				if db != nil {
					db.Stop()
				}
			}
			return nil, fmt.Errorf("shard %s: %w", shards[i], err)
		}
	}
	return dbs, nil
}

// orderPlaced is the event's payload.
type orderPlaced struct {
	Customer string `json:"customer"`
	N        int    `json:"n"` // the customer's nth order
}

// placeOrder stores a customer's nth order and publishes OrderPlaced in
// one transaction of the customer's shard: the event exists if and only if
// the order does.
func placeOrder(ctx context.Context, db *exampledb.DB, pub *outbox.Publisher, customer string, n int) error {
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (customer, n) VALUES ($1, $2)`, customer, n); err != nil {
			return err
		}
		payload, _ := json.Marshal(orderPlaced{customer, n})
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(outbox.PublishPartitionKeyMetadata, customer) // per-customer order, and the Kafka key
		msg.SetContext(outbox.WithTx(ctx, tx))
		return pub.Publish("orders", msg)
	})
}

// record is what the check needs of a Kafka record.
type record struct {
	source, id     string // headers outbox_source and outbox_id
	outboxPart     string // header outbox_partition
	kafkaPartition int32
	key            string
	order          orderPlaced
}

// reading is a read of the Kafka topic: the records so far (transaction
// markers left out) and, per partition, the offset after the last record
// or marker read.
type reading struct {
	records []record
	next    map[int32]int64
}

// until polls the topic until done reports true.
func (r *reading) until(ctx context.Context, client *kgo.Client, done func() bool) error {
	if r.next == nil {
		r.next = map[int32]int64{}
	}
	for !done() {
		fetches := client.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fetches.Err(); err != nil {
			return err
		}
		var bad error
		fetches.EachRecord(func(kr *kgo.Record) {
			r.next[kr.Partition] = kr.Offset + 1
			if kr.Attrs.IsControl() {
				return
			}
			rec := record{kafkaPartition: kr.Partition, key: string(kr.Key)}
			for _, h := range kr.Headers {
				switch h.Key {
				case outbox.MetadataSource:
					rec.source = string(h.Value)
				case outbox.MetadataID:
					rec.id = string(h.Value)
				case outbox.MetadataPartition:
					rec.outboxPart = string(h.Value)
				}
			}
			if err := json.Unmarshal(kr.Value, &rec.order); err != nil && bad == nil {
				bad = fmt.Errorf("record at offset %d of partition %d: %w", kr.Offset, kr.Partition, err)
			}
			r.records = append(r.records, rec)
		})
		if bad != nil {
			return bad
		}
	}
	return nil
}

// check verifies the records read: each order exactly once (by its
// customer and number, and by its (source, id)), in order per customer,
// from the customer's shard, on the Kafka partition of its outbox
// partition.
func check(records []record) error {
	type sourceID struct{ source, id string }
	seen := map[sourceID]bool{}
	last := map[string]int{} // customer → the number of its last order read
	for _, r := range records {
		c, n := r.order.Customer, r.order.N
		if want := shards[shardOf(c)]; r.source != want {
			return fmt.Errorf("%s's order %d came from source %q, not from its shard %s", c, n, r.source, want)
		}
		if seen[sourceID{r.source, r.id}] {
			return fmt.Errorf("%s's order %d: %s of %s read twice", c, n, r.id, r.source)
		}
		seen[sourceID{r.source, r.id}] = true
		if n != last[c]+1 { // a copy, a gap or a reordering
			return fmt.Errorf("%s: order %d read after order %d", c, n, last[c])
		}
		last[c] = n
		if r.key != c || r.outboxPart != strconv.Itoa(int(r.kafkaPartition)) {
			return fmt.Errorf("%s's order %d: key %q, outbox partition %s, Kafka partition %d", c, n, r.key, r.outboxPart, r.kafkaPartition)
		}
	}
	if len(records) != totalOrders || len(last) != customers {
		return fmt.Errorf("%d records of %d customers, want %d of %d", len(records), len(last), totalOrders, customers)
	}
	for c, n := range last {
		if n != ordersEach {
			return fmt.Errorf("%s: %d orders read, want %d", c, n, ordersEach)
		}
	}
	return nil
}

// collision returns an outbox id that arrived from the most sources, and
// those sources: each database numbers its messages "orders/<partition>/<seq>"
// from 1, so the same ids come from every shard.
func collision(records []record) (string, []string) {
	sources := map[string][]string{} // outbox_id → sources
	for _, r := range records {
		sources[r.id] = append(sources[r.id], r.source)
	}
	best := ""
	for id, from := range sources {
		if len(from) > len(sources[best]) || len(from) == len(sources[best]) && id < best {
			best = id
		}
	}
	from := sources[best]
	slices.Sort(from)
	return best, from
}

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
)

// recorder keeps what the publishers tried to publish, and what became of
// it.
type recorder struct {
	mu   sync.Mutex
	msgs []Message
	txOf []string // the transaction of each message

	txCommitted, txRolledBack, txFailed, txInDoubt, inDoubtCommitted, txHeld atomic.Int64
	// txNanos sums the time the transactions took, txCount counts them.
	txNanos, txCount atomic.Int64
}

func newRecorder() *recorder { return &recorder{} }

func (rec *recorder) add(tx string, msgs []Message, status Status) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, m := range msgs {
		m.Status = status
		rec.msgs = append(rec.msgs, m)
		rec.txOf = append(rec.txOf, tx)
	}
}

func (rec *recorder) messages() []Message {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]Message(nil), rec.msgs...)
}

// resolve settles the in-doubt transactions: a transaction committed if
// and only if its row in chaos_txs exists (it was written in the same
// transaction). It also checks that the server kept every commit it
// acknowledged and none it did not make, which the verdict depends on.
func (rec *recorder) resolve(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	var committed map[string]bool
	for {
		rows, err := pool.Query(ctx, `SELECT tx FROM `+schema+`.chaos_txs`)
		if err == nil {
			var txs []string
			txs, err = pgx.CollectRows(rows, pgx.RowTo[string])
			committed = make(map[string]bool, len(txs))
			for _, tx := range txs {
				committed[tx] = true
			}
		}
		if err == nil {
			break
		}
		if !sleep(ctx, 500*time.Millisecond) {
			t.Fatalf("reading the committed transactions: %v", err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	resolved := map[string]bool{}
	for i := range rec.msgs {
		m, tx := &rec.msgs[i], rec.txOf[i]
		injected := strings.HasPrefix(tx, "selftest-")
		switch {
		case m.Status == InDoubt:
			if committed[tx] {
				m.Status = Committed
				if !resolved[tx] {
					rec.inDoubtCommitted.Add(1)
				}
			} else {
				m.Status = RolledBack
			}
			resolved[tx] = true
		case injected:
		case m.Status == Committed && !committed[tx]:
			t.Errorf("the server lost the acknowledged commit of transaction %s (synchronous_commit off?)", tx)
		case m.Status == RolledBack && committed[tx]:
			t.Errorf("transaction %s committed though it failed or was rolled back", tx)
		}
	}
}

// errInDoubt: COMMIT was sent but its outcome is unknown.
var errInDoubt = errors.New("commit outcome unknown")

// publish runs one publisher until ctx ends: a transaction per tick of
// pace, of one or two keys (locked in key order), one or two messages per
// key numbered by the key's counter (1%: 20 to 60 messages of one key);
// 10% rolled back on purpose, some held open for a while (the scenario's
// holds: by default 5% for up to 2 s and 0.5% for up to 8 s, longer than
// a lease).
func (r *run) publish(ctx context.Context, pub *outbox.Publisher, id int, pace <-chan time.Time) {
	rng := r.rng(100 + uint64(id))
	for i := 0; ; i++ {
		select {
		case <-pace:
		case <-ctx.Done():
			return
		}
		r.publishTx(ctx, pub, rng, fmt.Sprintf("p%d-%d", id, i), false)
	}
}

// publishPoison commits one transaction whose first message is poison,
// trying again (each try a transaction of its own) until one commits or
// ctx ends; it reports whether one committed. The 1% of poison messages
// is chance; a run that must see one makes sure with this.
func (r *run) publishPoison(ctx context.Context, pub *outbox.Publisher, rng *rand.Rand) bool {
	for i := 0; ; i++ {
		if r.publishTx(ctx, pub, rng, fmt.Sprintf("poison-%d", i), true) == Committed {
			return true
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return false
		}
	}
}

// publishTx runs one transaction (with poison: of one key, its first
// message poison, committed at once) and returns what became of it; a
// hold ends early when chaos ends.
func (r *run) publishTx(chaos context.Context, pub *outbox.Publisher, rng *rand.Rand, txID string, poison bool) Status {
	chosen := map[string]bool{}
	bulk := rng.Float64() < 0.01
	nKeys := 1 + rng.IntN(2)
	if bulk || poison {
		bulk, nKeys = false, 1
	}
	for len(chosen) < nKeys {
		chosen[fmt.Sprintf("k%02d", rng.IntN(keys))] = true
	}
	sorted := make([]string, 0, len(chosen))
	for k := range chosen {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	rollback := rng.Float64() < 0.1
	var hold time.Duration
	x, share := rng.Float64(), 0.0
	for _, h := range r.sc.holdShares() {
		if share += h.share; x < share {
			hold = h.min + time.Duration(rng.IntN(int((h.max-h.min)/time.Millisecond)))*time.Millisecond
			break
		}
	}
	if poison {
		rollback, hold = false, 0
	}
	type plan struct {
		key    string
		count  int
		poison []bool
	}
	var plans []plan
	for _, key := range sorted {
		p := plan{key: key, count: 1 + rng.IntN(2)}
		if bulk {
			p.count = 20 + rng.IntN(41)
		}
		for j := 0; j < p.count; j++ {
			p.poison = append(p.poison, rng.Float64() < poisonRate || poison && j == 0)
		}
		plans = append(plans, p)
	}
	// A poison message that must be too large for the broker is padded
	// with random letters, so that compression would not shrink it.
	pad := func(poison bool) string {
		if !poison || r.sc.poisonBytes == 0 {
			return defaultPad
		}
		b := make([]byte, r.sc.poisonBytes)
		for i := range b {
			b[i] = 'a' + byte(rng.IntN(26))
		}
		return string(b)
	}

	// Not the chaos context: a transaction under way is finished.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	defer func() {
		r.rec.txNanos.Add(int64(time.Since(began)))
		r.rec.txCount.Add(1)
	}()
	var msgs []Message
	err := func() error {
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		var batch []*message.Message
		for _, p := range plans {
			var n int
			if err := tx.QueryRow(ctx, `UPDATE `+schema+`.chaos_keys SET n = n + $2 WHERE key = $1 RETURNING n`, p.key, p.count).Scan(&n); err != nil {
				return err
			}
			for j := 0; j < p.count; j++ {
				m, wm := newPaddedMessage(fmt.Sprintf("%s-%d", txID, len(msgs)), p.key, n-p.count+1+j, txID, p.poison[j], rollback, pad(p.poison[j]))
				wm.SetContext(outbox.WithTx(ctx, tx))
				batch = append(batch, wm)
				msgs = append(msgs, m)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.chaos_txs VALUES ($1)`, txID); err != nil {
			return err
		}
		if err := pub.Publish(topic, batch...); err != nil {
			return err
		}
		if hold > 0 {
			r.rec.txHeld.Add(1)
			sleep(chaos, hold)
		}
		if rollback {
			return tx.Rollback(ctx)
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("%w: %w", errInDoubt, err)
		}
		return nil
	}()
	switch {
	case errors.Is(err, errInDoubt):
		r.rec.txInDoubt.Add(1)
		r.rec.add(txID, msgs, InDoubt)
		return InDoubt
	case err != nil:
		r.rec.txFailed.Add(1)
		r.rec.add(txID, msgs, RolledBack)
	case rollback:
		r.rec.txRolledBack.Add(1)
		r.rec.add(txID, msgs, RolledBack)
	default:
		r.rec.txCommitted.Add(1)
		r.rec.add(txID, msgs, Committed)
		return Committed
	}
	return RolledBack
}

// defaultPad pads every payload but a scenario's oversized poison.
var defaultPad = strings.Repeat("x", 64)

// newMessage builds a message and its record.
func newMessage(uuid, key string, n int, txID string, poison, rollback bool) (Message, *message.Message) {
	return newPaddedMessage(uuid, key, n, txID, poison, rollback, defaultPad)
}

// newPaddedMessage is newMessage with the payload's padding pad.
func newPaddedMessage(uuid, key string, n int, txID string, poison, rollback bool, pad string) (Message, *message.Message) {
	body, err := json.Marshal(Payload{ID: uuid, Key: key, N: n, Tx: txID, Poison: poison, Rollback: rollback,
		Pad: pad})
	if err != nil {
		panic(err)
	}
	wm := message.NewMessage(uuid, body)
	wm.Metadata.Set(outbox.PublishPartitionKeyMetadata, key)
	return Message{UUID: uuid, Key: key, N: n, Payload: string(body), Poison: poison}, wm
}

// injectTx publishes msgs in a transaction of its own and commits it (with
// its chaos_txs row) or rolls it back.
func (r *run) injectTx(pub *outbox.Publisher, txID string, msgs []*message.Message, commit bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, m := range msgs {
		m.SetContext(outbox.WithTx(ctx, tx))
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback(ctx)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.chaos_txs VALUES ($1)`, txID); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%w: %w", errInDoubt, err)
	}
	return nil
}

// inject breaks the run on purpose (-chaos.selftest), once of each kind,
// each on a key of its own:
//   - lost: a message rolled back but recorded as committed (to the
//     verifier, a committed message that never arrives);
//   - phantom: a message committed but recorded as rolled back;
//   - reordered: n=2 published before n=1 of a key, in one transaction;
//   - duplicate without the same outbox_id: a message published again,
//     same UUID and payload, in a second transaction (a second outbox id).
func (r *run) inject(pub *outbox.Publisher) {
	t := r.t
	r.injected = map[Kind]string{Lost: "selftest-lost", Phantom: "selftest-phantom", Reordered: "selftest-reorder", DuplicateNewID: "selftest-dup"}
	record := func(txID string, msgs []Message, err error, ok Status) bool {
		switch {
		case err == nil:
			r.rec.add(txID, msgs, ok)
			return true
		case errors.Is(err, errInDoubt):
			r.rec.add(txID, msgs, InDoubt)
		default:
			r.rec.add(txID, msgs, RolledBack)
		}
		t.Logf("self-test: injection %s failed, trying again: %v", txID, err)
		time.Sleep(500 * time.Millisecond)
		return false
	}
	for i := 0; i < 20; i++ {
		txID := fmt.Sprintf("selftest-lost-%d", i)
		m, wm := newMessage(txID, "selftest-lost", 1, txID, false, false)
		if record(txID, []Message{m}, r.injectTx(pub, txID, []*message.Message{wm}, false), Committed) {
			break
		}
	}
	for i := 0; i < 20; i++ {
		txID := fmt.Sprintf("selftest-phantom-%d", i)
		m, wm := newMessage(txID, "selftest-phantom", 1, txID, false, true)
		if record(txID, []Message{m}, r.injectTx(pub, txID, []*message.Message{wm}, true), RolledBack) {
			break
		}
	}
	for i := 0; i < 20; i++ {
		txID := fmt.Sprintf("selftest-reorder-%d", i)
		m2, wm2 := newMessage(txID+"-n2", "selftest-reorder", 2*i+2, txID, false, false)
		m1, wm1 := newMessage(txID+"-n1", "selftest-reorder", 2*i+1, txID, false, false)
		if record(txID, []Message{m2, m1}, r.injectTx(pub, txID, []*message.Message{wm2, wm1}, true), Committed) {
			break
		}
	}
	for i := 0; i < 20; i++ {
		txID := fmt.Sprintf("selftest-dup-%d", i)
		m, wm := newMessage(txID, "selftest-dup", i+1, txID, false, false)
		if !record(txID, []Message{m}, r.injectTx(pub, txID, []*message.Message{wm}, true), Committed) {
			continue
		}
		for j := 0; j < 20; j++ {
			again := message.NewMessage(wm.UUID, wm.Payload)
			again.Metadata.Set(outbox.PublishPartitionKeyMetadata, "selftest-dup")
			err := r.injectTx(pub, fmt.Sprintf("%s-again-%d", txID, j), []*message.Message{again}, true)
			if err == nil {
				break
			}
			t.Logf("self-test: injection %s-again failed, trying again: %v", txID, err)
			time.Sleep(500 * time.Millisecond)
		}
		break
	}
	t.Logf("%6.1fs: self-test: injected one lost, one phantom, one reordered and one duplicated message", time.Since(r.started).Seconds())
}

// readKafka reads every committed record of topic (isolation level
// read_committed, as consumers of an exactly-once forwarder must read),
// partition by partition, each in offset order, up to the last stable
// offsets, with franz-go's kgo.
func readKafka(ctx context.Context, brokers []string, topic string) ([]Delivery, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("chaos-verifier"))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	admin := kadm.NewClient(cl)
	starts, err := admin.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("start offsets: %w", err)
	}
	ends, err := admin.ListCommittedOffsets(ctx, topic) // the last stable offsets
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets: %w", err)
	}
	from := map[int32]kgo.Offset{}
	until := map[int32]int64{}
	var order []int32
	ends.Each(func(o kadm.ListedOffset) {
		if s, _ := starts.Lookup(topic, o.Partition); o.Offset > s.Offset {
			from[o.Partition] = kgo.NewOffset().At(s.Offset)
			until[o.Partition] = o.Offset
			order = append(order, o.Partition)
		}
	})
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	if len(from) == 0 {
		return nil, nil
	}
	consumer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("chaos-verifier"),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), // a transaction's last offset is its marker: seeing it ends the partition
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	got := map[int32][]Delivery{}
	done := map[int32]bool{}
	idle := time.Now()
	for len(done) < len(from) {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fetches := consumer.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ferr error
		fetches.EachError(func(_ string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("partition %d: %w", p, err)
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		progress := false
		fetches.EachRecord(func(r *kgo.Record) {
			progress = true
			if done[r.Partition] || r.Offset >= until[r.Partition] {
				done[r.Partition] = true
				return
			}
			if r.Offset == until[r.Partition]-1 {
				done[r.Partition] = true
			}
			if r.Attrs.IsControl() {
				return
			}
			d := Delivery{Key: string(r.Key), Payload: string(r.Value)}
			for _, h := range r.Headers {
				switch h.Key {
				case kafka.UUIDHeaderKey:
					d.UUID = string(h.Value)
				case outbox.MetadataID:
					d.OutboxID = string(h.Value)
				}
			}
			got[r.Partition] = append(got[r.Partition], d)
		})
		if progress {
			idle = time.Now()
		} else if time.Since(idle) > 3*time.Second {
			// What is left below the last stable offset are records of
			// aborted transactions whose markers lie beyond it.
			break
		}
	}
	var out []Delivery
	for _, p := range order {
		out = append(out, got[p]...)
	}
	return out, nil
}

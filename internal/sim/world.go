package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	kafkatarget "github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/internal/consumer"
	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/forward"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/lease"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
	"github.com/millrace/watermill-outbox/internal/tune"
	"github.com/millrace/watermill-outbox/internal/worker"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/relay"
)

// The world of one schedule: one outbox topic, its publishers and relays
// (modelled), forwarder instances running the real code into Kafka (the
// model), and the faults.

const (
	topic        = "orders"
	group        = "outbox-forwarder"
	schema       = "watermill_outbox"
	incarnation  = "1"
	maxMsgBytes  = 16 << 10 // the broker's max message size
	poisonBytes  = 20 << 10 // a poison message's payload
	txnTimeout   = 10 * time.Second
	handlerLimit = 1000 * time.Hour // the forwarders' HandlerTimeout: sends end with their calls
)

// shape is what a seed draws of the world.
type shape struct {
	partitions, kafkaPartitions int
	instances                   int // forwarder instances at the start
	maxInstances                int
	messages                    int // to commit
	keys                        int
	poison                      float64
	batch                       int
	ttl                         time.Duration
	syncCursor                  bool
	chaosActions                int
	burst                       int           // transactions published at once, at most
	linger                      time.Duration // the targets' Linger
	foreign                     bool          // another producer writes to the Kafka topic
	// legacy: the outbox was upgraded from a version before writer
	// records: every cursor row starts with its writer unknown (NULL), and
	// each partition's old per-partition producer has a transaction open.
	legacy bool
	// direct: the topic is forwarder-only (outbox.ForwardOnly): the
	// forwarders run internal/direct's loop on pending (publishers commit
	// late, out of id order); no relay, no log.
	direct bool
	// directWAL: a forwarder-only topic in the log-based mode: publishers
	// commit into the WAL, the relays put the messages into pending in
	// commit order, the forwarders take them from there (with direct).
	directWAL bool

	// fault rates
	callFault, kill, freeze, join, leave float64
	dbCrash, kafkaOutage, convert        float64
}

func drawShape(s *Sim) shape {
	sh := shape{
		partitions:   1 + s.intn(4),
		instances:    1 + s.intn(3),
		maxInstances: 3,
		messages:     10 + s.intn(40),
		keys:         1 + s.intn(6),
		batch:        1 + s.intn(12),
		ttl:          time.Duration(1+s.intn(4)) * time.Second,
		syncCursor:   s.chance(0.3),
		chaosActions: 200 + s.intn(400),
		burst:        1 + s.intn(6),
	}
	if s.chance(0.5) {
		sh.linger = time.Duration(1+s.intn(50)) * time.Millisecond
	}
	if s.chance(0.3) {
		// Busy: more partitions with batches at once, which the targets'
		// rounds send in one transaction.
		sh.partitions = 4 + s.intn(5)
		sh.messages = 60 + s.intn(100)
		sh.burst = 4 + s.intn(8)
	}
	sh.kafkaPartitions = sh.partitions
	sh.foreign = s.chance(0.3)
	if s.chance(0.2) {
		sh.kafkaPartitions = 1 + s.intn(5)
	}
	if s.chance(0.6) {
		sh.poison = 0.05
	}
	// Some seeds are calm, some stormy.
	storm := s.rng.Float64()
	sh.callFault = 0.03 * storm
	sh.kill = 0.02 * storm
	sh.freeze = 0.02 * storm
	sh.join = 0.01 * storm
	sh.leave = 0.005 * storm
	sh.dbCrash = 0.002 * storm
	sh.kafkaOutage = 0.01 * storm
	sh.convert = 0.05 * s.rng.Float64()
	sh.legacy = s.chance(0.25)
	sh.direct = s.chance(0.3)
	sh.directWAL = sh.direct && s.chance(0.4)
	return sh
}

// committedTxn is one transaction committed to the outbox.
type committedTxn struct {
	msgs []pubMsg
}

// pubMsg is a message as published.
type pubMsg struct {
	uuid      string
	key       string
	partition int
	poison    bool
	payload   []byte
	// A forwarder-only topic's: when its transaction inserted it and when
	// it committed (the world's publish clock, pubClock).
	inserted, committed int
}

// openPub is a publisher's transaction on a forwarder-only topic that
// inserted its rows (their ids drawn) and has not ended.
type openPub struct {
	msgs []pubMsg
	rows []pendingRow
}

// world is one schedule's state.
type world struct {
	s     *Sim
	sh    shape
	start time.Time
	db    *db
	k     *kafka

	wal       *wal
	instances []*instance
	relays    []*relayProc
	published []committedTxn // committed to the outbox, in commit order
	openPubs  []*openPub     // forwarder-only topic: transactions not ended
	// reconciled: messages the forwarder-only topic's takeovers found in
	// Kafka beyond a cursor (of the instances stopped so far).
	reconciled int64
	pubClock   int
	gap        bool // a model did not simulate what the code ran (gapLogger)
	nextID     int
	nextMsg    int
	storm      bool // faults are injected (false while draining)
	trustEnd   bool // Options.TrustEndTxn
	failures   []string
	res        *Result
}

// instance is a forwarder process: a lease manager, a Subscription of
// Workers, the Forwarder's batch handler and a Kafka target, all real, on
// the models.
type instance struct {
	w      *world
	name   string
	proc   *proc
	conn   *conn
	target kafkadriver.Target
	mgr    *lease.Manager
	sub    *consumer.Subscription
	loop   *direct.Loop // a forwarder-only topic's (sh.direct), instead of mgr and sub
	// leaving: its next step stops it gracefully (Subscription.Close:
	// the workers stop, the leases are given back); left: it did.
	leaving, left bool
}

// relayProc is a relay process: the relay package's code (internal/relaydriver)
// on the model of the WAL, the slot and the tables.
type relayProc struct {
	name    string
	proc    *proc
	backend *walBackend
}

// now is the fake clock.
func (w *world) now() time.Time { return time.Now() }

func newWorld(s *Sim, opt Options) *world {
	w := &world{s: s, start: time.Now(), storm: true, trustEnd: opt.TrustEndTxn}
	w.sh = drawShape(s)
	if opt.NoConversion {
		w.sh.convert = 0
	}
	w.populate()
	return w
}

// populate makes the world's database, Kafka, forwarders and relays, of
// its shape.
func (w *world) populate() {
	w.db = newDB(w.now)
	w.k = newKafka(w.now, txnTimeout, maxMsgBytes, kafkatarget.DefaultMaxBatchBytes, kafkatarget.Partitioner())
	w.k.kfakeOrder = w.s.chance(0.5)
	w.k.createTopic(topic, w.sh.kafkaPartitions)
	if w.sh.legacy {
		w.upgradedFromLegacy()
	}
	for range w.sh.instances {
		w.addInstance()
	}
	w.wal = newWAL(w.db, schema)
	w.wal.forwardOnly = w.sh.directWAL
	if w.sh.direct && !w.sh.directWAL {
		return // publishers insert into pending: nothing to relay
	}
	for _, name := range []string{"relay-a", "relay-b"} {
		w.addRelay(name)
	}
}

// legacyID is the transactional id forwarders before writer records used
// for outbox partition p (forwarder/kafka's partitionTransactionalID).
func legacyID(p int) string {
	return strings.Join([]string{"sim", schema, group, topic, strconv.Itoa(p)}, "/")
}

// upgradedFromLegacy makes the world one upgraded from a version before
// writer records (migration 0015): every cursor row exists with its
// writer unknown, and each partition's old producer has a transaction
// open with a record in it (another source's, to the checks), as a
// forwarder of the old version stopped mid-send would leave it. A takeover
// must fence that id (InitProducerId) before it records itself: check
// counts the fences.
func (w *world) upgradedFromLegacy() {
	for p := range w.sh.partitions {
		w.db.cursors[cursorKey{group, topic, p}] = &cursorRow{writerNull: true}
		id := legacyID(p)
		w.k.init(id)
		st := w.k.ids[id]
		t := w.k.begin(id, st)
		kp := int32(p % w.sh.kafkaPartitions)
		t.parts[topicPartition{topic, kp}] = true
		w.k.topics[topic][kp].append(krecord{key: []byte("legacy"), value: []byte("x"), txn: t, pid: st.pid, headers: []kgo.RecordHeader{
			{Key: outbox.MetadataID, Value: []byte(topic + "/" + strconv.Itoa(p) + "/1")}, {Key: outbox.MetadataSource, Value: []byte("legacy")},
		}})
	}
	w.db.flush()
}

// addRelay starts a relay process.
func (w *world) addRelay(name string) *relayProc {
	rp := &relayProc{name: name}
	rp.backend = &walBackend{w: w.wal}
	run, err := relaydriver.Run(relay.Config{
		Schema:            schema,
		MaxBatch:          1 + w.s.intn(20),
		MinAppendInterval: time.Duration(w.s.intn(3)) * 10 * time.Millisecond,
		StandbyRetry:      500 * time.Millisecond,
		WarnRetainedWAL:   -1,
		DisableNotify:     true,
		TakeoverTimeout:   takeover,
		Instance:          name,
	}, gapLogger{w: w}, rp.backend, w.jitter)
	if err != nil {
		panic(err)
	}
	rp.proc = w.s.spawn(name, func(ctx context.Context) { _ = run(ctx) })
	rp.backend.p = rp.proc
	w.s.runStep(rp.proc) // a relay's step is its life
	for i, x := range w.relays {
		if x.name == name {
			w.relays[i] = rp
			return rp
		}
	}
	w.relays = append(w.relays, rp)
	return rp
}

// killRelay kills a relay process: its streams and sessions end.
func (w *world) killRelay(rp *relayProc) {
	w.s.kill(rp.proc)
	rp.backend.die()
}

// restartRelay replaces a dead relay by a new process.
func (w *world) restartRelay(rp *relayProc) {
	w.s.stop(rp.proc)
	w.addRelay(rp.name)
}

// takeover is the relays' TakeoverTimeout (wal_sender_timeout, and three
// times the append connections' lock_timeout).
const takeover = 3 * time.Second

// addInstance starts a forwarder process.
func (w *world) addInstance() *instance {
	w.nextID++
	in := &instance{w: w, name: "fwd-" + strconv.Itoa(w.nextID)}
	in.proc = w.s.spawn(in.name, in.step)
	in.conn = &conn{d: w.db, p: in.proc, group: group, txs: map[*simTx]bool{}}
	logger := gapLogger{w: w}
	drv := &kafkaDriver{k: w.k, p: in.proc, trustEnd: w.trustEnd, convertCommit: func() bool {
		if w.storm && w.s.chance(w.sh.convert) {
			w.res.Converted++
			return true
		}
		return false
	}}
	target, err := kafkadriver.NewTarget(kafkatarget.Config{
		Brokers:               []string{"sim:9092"},
		TransactionalIDPrefix: "sim",
		TransactionTimeout:    txnTimeout,
		Linger:                w.sh.linger,
	}, logger, func(watermill.LoggerAdapter) (kafkadriver.Driver, error) { return drv, nil }, in.name)
	if err != nil {
		panic(err)
	}
	in.target = target
	if w.sh.direct {
		dt, ok := direct.Adapt(target)
		if !ok {
			panic("sim: the Kafka target does not forward forwarder-only topics")
		}
		in.loop = direct.New(direct.Config{
			Store: in.conn, Schema: schema, Group: group, Topic: topic, Partitions: w.sh.partitions,
			Incarnation: incarnation, TargetTopic: topic, Target: dt,
			Lease: lease.Config{
				Store: in.conn, MemberID: in.name, TTL: w.sh.ttl, RenewInterval: w.sh.ttl / 5,
				BalanceInterval: min(lease.DefaultBalanceInterval, w.sh.ttl/10),
			},
			BatchSize: w.sh.batch, BackoffBase: 100 * time.Millisecond, BackoffMax: 2 * time.Second,
			SendTimeout: handlerLimit, RejectHandler: outboxtype.RejectHandlerFunc(in.deadLetter), Logger: logger,
		})
		w.instances = append(w.instances, in)
		return in
	}
	mgr, err := lease.NewManager(lease.Config{
		Schema: schema, Store: in.conn, Group: group, Topic: topic, Partitions: w.sh.partitions,
		MemberID: in.name, TTL: w.sh.ttl, RenewInterval: w.sh.ttl / 5, BalanceInterval: min(lease.DefaultBalanceInterval, w.sh.ttl/10),
	}, logger)
	if err != nil {
		panic(err)
	}
	in.mgr = mgr
	handler := forward.Handler(forward.Config{
		Schema: schema, Group: group, Topic: topic, TargetTopic: topic, Partitions: w.sh.partitions,
		Send: forward.TargetSend(target), Logger: logger,
	})
	profile := tune.Default
	cfg := &consumer.Config{
		Group:             group,
		MaxAttempts:       0, // outbox.RetryForever, the Forwarder's default
		HandlerTimeout:    handlerLimit,
		CloseTimeout:      time.Second,
		SyncCursorCommits: w.sh.syncCursor,
		Tuning:            profile.Settings(w.sh.batch, 100*time.Millisecond, 2*time.Second, time.Second),
		RejectHandler:     consumer.RejectHandlerFunc(in.deadLetter),
		Store:             in.conn,
		Careful:           &consumer.Careful{},
		Logger:            logger,
		Gate:              consumer.NewGate(),
		Jitter:            w.jitter,
		Counts:            &consumer.Counts{},
	}
	in.sub = consumer.NewSubscription(cfg, mgr, topic, incarnation, nil, handler)
	w.instances = append(w.instances, in)
	return in
}

// step is one step of a forwarder: its lease manager's round and a turn
// of each partition it holds, the turns at once as the product's Workers
// run (Subscription.StepConcurrently): their batches meet in the target's
// rounds.
func (in *instance) step(ctx context.Context) {
	if in.loop != nil {
		if in.leaving {
			in.loop.Stop(ctx)
			in.left = true
			return
		}
		_, _ = in.loop.Step(withRole(ctx, "fwd"))
		return
	}
	if in.leaving {
		in.sub.Close(ctx)
		in.left = true
		return
	}
	_, _ = in.sub.StepConcurrently(ctx, func(wk *consumer.Worker) (worker.Directive, error) {
		role := "p" + strconv.Itoa(wk.Partition())
		// Each turn starts when the scheduler says, one at a time: turns
		// that started together would race for the process's delivery
		// gate, and a replay would not be exact.
		if in.proc.enter("turn/"+role, "turn "+role, nil).kills() {
			return worker.Idle(), errConnection
		}
		return wk.Step(withRole(ctx, role))
	})
}

// removeLeft removes the instances that stopped gracefully.
func (w *world) removeLeft() {
	for i := 0; i < len(w.instances); i++ {
		in := w.instances[i]
		if !in.left || in.proc.state != idle {
			continue
		}
		w.noteGone(in)
		w.s.stop(in.proc)
		_ = in.target.Close()
		w.instances = append(w.instances[:i], w.instances[i+1:]...)
		i--
	}
}

// jitter spreads a backoff as backoff.Jitter does, from the seed and the
// backoff alone: an instance's Workers, woken together by the end of a
// round, draw their backoffs in no fixed order, and draws from the
// schedule's generator would make a replay differ.
func (w *world) jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	x := w.s.seed ^ uint64(d)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return d/2 + time.Duration(x%uint64(d-d/2+1))
}

// deadLetter is the forwarders' RejectHandler: the dead letter is stored
// in the transaction that moves the cursor past the message.
func (in *instance) deadLetter(_ context.Context, tx pgx.Tx, m consumer.RejectedMessage) error {
	t, ok := tx.(*simTx)
	if !ok {
		return fmt.Errorf("sim: a %T is not a transaction of the model", tx)
	}
	reason := ""
	if m.Reason != nil {
		reason = m.Reason.Error()
	}
	return t.deadLetter(deadLetter{group: m.Group, topic: m.Topic, partition: m.Partition, seq: m.Seq, uuid: m.UUID, reason: reason, attempts: m.Attempts})
}

// kill kills a forwarder: its goroutine unwinds with every call failing,
// its connections' transactions are aborted, its memory is dropped.
func (w *world) killInstance(in *instance) {
	w.s.kill(in.proc)
	in.conn.abortAll()
}

// restart replaces a dead forwarder by a new process (a new member).
func (w *world) restart(in *instance) {
	w.noteGone(in)
	w.s.stop(in.proc)
	_ = in.target.Close()
	for i, x := range w.instances {
		if x == in {
			w.instances = append(w.instances[:i], w.instances[i+1:]...)
			break
		}
	}
	w.addInstance()
}

// publish commits a transaction of 1-3 messages to the outbox (or rolls
// one back: nothing happens). On a forwarder-only topic a transaction
// inserts first and commits at a later publish, so that others insert
// and commit meanwhile (a row can be seen after rows of greater ids).
func (w *world) publish() {
	if w.sh.direct && !w.sh.directWAL {
		w.publishPending()
		return
	}
	n := 1 + w.s.intn(3)
	if w.s.chance(0.1) {
		return // rolled back
	}
	var t committedTxn
	for range n {
		w.nextMsg++
		key := "k" + strconv.Itoa(w.s.intn(w.sh.keys))
		part, _ := partitioning.Murmur2{}.Partition(key, w.sh.partitions)
		m := pubMsg{uuid: "m" + strconv.Itoa(w.nextMsg), key: key, partition: part}
		m.payload = []byte(fmt.Sprintf("%s:%s", m.uuid, key))
		if w.s.chance(w.sh.poison) {
			m.poison = true
			m.payload = make([]byte, poisonBytes)
		}
		t.msgs = append(t.msgs, m)
	}
	// (In the WAL a transaction inserts and commits at once, for the
	// order check of a forwarder-only topic.)
	w.pubClock++
	for i := range t.msgs {
		t.msgs[i].inserted, t.msgs[i].committed = w.pubClock, w.pubClock
	}
	w.published = append(w.published, t)
	w.wal.commit(t.msgs)
	w.s.trace("publish %d messages (txn %d)", n, len(w.published))
}

// publishedCount is how many messages were committed.
func (w *world) publishedCount() int {
	n := 0
	for _, t := range w.published {
		n += len(t.msgs)
	}
	return n
}

// foreignStep is a step of another producer of the Kafka topic (another
// source's forwarder, say): it opens transactions with records in the
// topic's partitions and commits them, aborts them, or leaves them open
// (until the coordinator's timeout). Its open transactions hold the last
// stable offset back, which a takeover's tail read must wait out.
func (w *world) foreignStep() {
	const id = "foreign/source=other"
	k := w.k
	st := k.ids[id]
	if st == nil {
		k.init(id)
		st = k.ids[id]
	}
	if st.cur == nil {
		if w.s.chance(0.5) {
			return
		}
		k.begin(id, st)
	}
	switch x := w.s.rng.Float64(); {
	case x < 0.25:
		k.end(st.cur, true)
		st.cur = nil
		st.epoch++
	case x < 0.35:
		k.end(st.cur, false)
		st.cur = nil
		st.epoch++
	case x < 0.7:
		kp := int32(w.s.intn(len(k.topics[topic])))
		st.cur.parts[topicPartition{topic, kp}] = true
		k.topics[topic][kp].append(krecord{key: []byte("other"), value: []byte("x"), txn: st.cur, pid: st.pid, headers: []kgo.RecordHeader{
			{Key: outbox.MetadataID, Value: []byte(topic + "/0/1")}, {Key: outbox.MetadataSource, Value: []byte("other")},
		}})
	}
}

// publishPending is publish on a forwarder-only topic: it begins a
// transaction that inserts 1-3 messages (their ids drawn), or ends one of
// those still open: most commit, some roll back.
func (w *world) publishPending() {
	if len(w.openPubs) > 0 && (w.s.chance(0.5) || len(w.openPubs) >= 4) {
		i := w.s.intn(len(w.openPubs))
		op := w.openPubs[i]
		w.openPubs = append(w.openPubs[:i], w.openPubs[i+1:]...)
		if w.s.chance(0.1) {
			w.s.trace("publisher rolls back %d messages", len(op.msgs))
			return
		}
		w.commitPub(op)
		return
	}
	w.pubClock++
	n := 1 + w.s.intn(3)
	op := &openPub{}
	for range n {
		w.nextMsg++
		key := "k" + strconv.Itoa(w.s.intn(w.sh.keys))
		part, _ := partitioning.Murmur2{}.Partition(key, w.sh.partitions)
		m := pubMsg{uuid: "m" + strconv.Itoa(w.nextMsg), key: key, partition: part, inserted: w.pubClock}
		m.payload = []byte(fmt.Sprintf("%s:%s", m.uuid, key))
		if w.s.chance(w.sh.poison) {
			m.poison = true
			m.payload = make([]byte, poisonBytes)
		}
		op.msgs = append(op.msgs, m)
		op.rows = append(op.rows, pendingRow{partition: part, uuid: m.uuid, key: key, payload: m.payload, poison: m.poison})
	}
	op.rows = w.db.insertPending(op.rows)
	w.openPubs = append(w.openPubs, op)
	w.s.trace("publisher inserts %d messages (ids %d..%d)", n, op.rows[0].id, op.rows[len(op.rows)-1].id)
}

// commitPub commits an open transaction of the forwarder-only topic.
func (w *world) commitPub(op *openPub) {
	w.pubClock++
	for i := range op.msgs {
		op.msgs[i].committed = w.pubClock
	}
	w.db.commitPending(op.rows)
	w.published = append(w.published, committedTxn{msgs: op.msgs})
	w.s.trace("publisher commits %d messages (ids %d..%d, txn %d)", len(op.msgs), op.rows[0].id, op.rows[len(op.rows)-1].id, len(w.published))
}

// commitOpen commits the forwarder-only topic's open transactions (the
// drain).
func (w *world) commitOpen() {
	for _, op := range w.openPubs {
		w.commitPub(op)
	}
	w.openPubs = nil
}

// noteGone keeps the counts of an instance that is removed.
func (w *world) noteGone(in *instance) {
	if in.loop != nil {
		w.reconciled += in.loop.Stats().Reconciled
	}
}

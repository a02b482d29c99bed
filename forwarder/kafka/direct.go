package kafka

import (
	"context"
	"slices"
	"strconv"

	"github.com/millrace/watermill-outbox/internal/direct"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
	"github.com/millrace/watermill-outbox/internal/origin"
)

// Forwarder-only topics (outbox.ForwardOnly, internal/direct) go through
// the exactly-once producer as every topic does, with the partition and
// its lease given explicitly, and one more call: Reconcile, the tail read
// that returns what Kafka holds beyond a cursor, by pending row id.
func init() {
	direct.Adapt = func(target any) (direct.Target, bool) {
		t, ok := target.(*Target)
		if !ok || t == nil || t.producers == nil || t.cfg.AtLeastOnce {
			return nil, false
		}
		return directTarget{t}, true
	}
}

// directTarget is a Target as a direct.Target.
type directTarget struct{ t *Target }

// Reconcile implements direct.Target.
func (d directTarget) Reconcile(ctx context.Context, from origin.Origin, topic string, after int64) ([]direct.Held, error) {
	t := d.t
	driver, err := t.connect()
	if err != nil {
		return nil, err
	}
	s := &txnSend{ctx: ctx, topic: topic, o: from}
	var held []direct.Held
	t.txn.exclusive(func() {
		rctx, cancel := t.roundContext([]*txnSend{s})
		defer cancel()
		k := t.key(s)
		if st := t.txn.parts[k]; st != nil && from.Token != 0 && from.Token < st.token {
			err = errLeaseSuperseded
			return
		}
		// Taken over again, tail read included, whatever this producer
		// knows: the caller's numbering starts from what Kafka holds.
		delete(t.txn.parts, k)
		if err = t.ready(rctx, driver, s); err != nil {
			return
		}
		if t.txn.parts[k].lastSeq <= after {
			return
		}
		held, err = t.heldSince(rctx, driver, topic, from, after)
	})
	return held, err
}

// SendRound implements direct.Target: the batches go into the producer's
// next round together (one Kafka transaction).
func (d directTarget) SendRound(ctx context.Context, topic string, batches []*direct.Batch) {
	t := d.t
	driver, err := t.connect()
	if err != nil {
		for _, b := range batches {
			b.Done, b.Err = 0, err
		}
		return
	}
	sends := make([]*txnSend, 0, len(batches))
	for _, b := range batches {
		if len(b.Messages) == 0 {
			continue
		}
		sends = append(sends, &txnSend{ctx: ctx, topic: topic, batch: b.Messages, o: b.From, lead: make(chan struct{}), finished: make(chan struct{})})
	}
	if len(sends) > 0 {
		t.sendTogether(driver, sends)
	}
	i := 0
	for _, b := range batches {
		if len(b.Messages) == 0 {
			b.Done, b.Err = 0, nil
			continue
		}
		b.Done, b.Err = sends[i].done, sends[i].err
		i++
	}
}

// sendTogether puts sends into one round: led at once when no round is in
// flight, else queued together behind it (the first of them to be handed
// the lead takes the rest of them along).
func (t *Target) sendTogether(driver kafkadriver.Driver, sends []*txnSend) {
	t.txn.run(sends, false, t.linger, func(round []*txnSend) { t.round(driver, round) })
}

// heldSince returns the records of outbox partition o that topic holds
// committed with a seq above after, in seq order: each Kafka partition it
// may write to (one with equal partition counts) read backwards until a
// committed record of o at or below after, at most TailScanLimit records
// each.
func (t *Target) heldSince(ctx context.Context, driver kafkadriver.Driver, topic string, o origin.Origin, after int64) ([]direct.Held, error) {
	offsets, err := driver.Offsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	var held []direct.Held
	for _, kp := range t.tailPartitions(o, len(offsets)) {
		off := offsets[kp]
		var markers transactionMarkers
		end, step, scanned := off.End, int64(256), int64(0)
		for end > off.Start && scanned < int64(t.cfg.TailScanLimit) {
			from := max(off.Start, end-min(step, int64(t.cfg.TailScanLimit)-scanned))
			records, err := driver.ReadLog(ctx, topic, kp, from, end)
			if err != nil {
				return nil, err
			}
			markers.add(records)
			reached := false
			for _, r := range records {
				if r.Marker || (r.Transactional && !markers.committed(r.ProducerID, r.Offset)) {
					continue
				}
				seq := recordSeq(r.Record, o)
				switch {
				case seq == 0:
				case seq <= after:
					reached = true
				default:
					id, ok := pendingID(r)
					if ok && !slices.ContainsFunc(held, func(h direct.Held) bool { return h.Seq == seq }) {
						held = append(held, direct.Held{Seq: seq, PendingID: id})
					}
				}
			}
			if reached {
				break
			}
			scanned += end - from
			end, step = from, step*2
		}
	}
	slices.SortFunc(held, func(a, b direct.Held) int { return int(a.Seq - b.Seq) })
	return held, nil
}

// pendingID returns the pending row id a forwarder-only record carries.
func pendingID(r kafkadriver.LogRecord) (int64, bool) {
	for _, h := range r.Record.Headers {
		if h.Key == direct.MetadataPendingID {
			id, err := strconv.ParseInt(string(h.Value), 10, 64)
			return id, err == nil
		}
	}
	return 0, false
}

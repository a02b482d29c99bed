package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
)

// runDrain publishes a backlog of n messages with the real Publisher
// (NOTIFY off, 4 goroutines, 100 per transaction, untimed), then drains it
// with the real outbox.Sequencer's SequenceAll (default configuration,
// timed) and checks that the log holds all n.
func runDrain(ctx context.Context, e *env, t timer, size, n int) (phase, error) {
	schema, err := e.newSchema(ctx, "seq")
	if err != nil {
		return phase{}, err
	}
	defer func() { _ = e.dropSchema(context.WithoutCancel(ctx), schema) }()
	target, err := setupOutbox(ctx, e, schema, true)
	if err != nil {
		return phase{}, err
	}
	// As in BenchmarkSequencerLayout: checkpoint before publishing, none
	// between publishing and sequencing (so no full-page images then).
	if err := e.maybeCheckpoint(ctx); err != nil {
		return phase{}, err
	}
	err = e.publishConcurrently(ctx, n, 100, size, func(ctx context.Context, tx pgx.Tx, g *gen, k int) error {
		return target.publish(ctx, tx, g.messages(k))
	})
	if err != nil {
		return phase{}, fmt.Errorf("backlog: %w", err)
	}
	// The same statistics the raw layouts get (autovacuum would gather them
	// in a running system).
	if _, err := e.admin.Exec(ctx, sqlFor(schema, "ANALYZE {{s}}.pending; ANALYZE {{s}}.log; ANALYZE {{s}}.partitions")); err != nil {
		return phase{}, err
	}
	seq, err := outbox.NewSequencer(outbox.SequencerConfig{Schema: schema, Pool: e.pool}, nil)
	if err != nil {
		return phase{}, err
	}
	ph, err := e.measure(ctx, t, n, func() error {
		got, err := seq.SequenceAll(ctx)
		if err == nil && got != n {
			err = fmt.Errorf("SequenceAll sequenced %d, want %d", got, n)
		}
		return err
	})
	if err != nil {
		return phase{}, err
	}
	if got, err := e.count(ctx, sqlFor(schema, "SELECT count(*) FROM {{s}}.log")); err != nil || got != n {
		return phase{}, fmt.Errorf("log holds %d messages, want %d (%v)", got, n, err)
	}
	if left, err := e.count(ctx, sqlFor(schema, "SELECT count(*) FROM {{s}}.pending")); err != nil || left != 0 {
		return phase{}, fmt.Errorf("%d messages left pending (%v)", left, err)
	}
	return ph, nil
}

// BenchmarkSequenceAll measures how fast the real Sequencer drains a backlog
// of committed messages (one op is one message sequenced). When
// BenchmarkSequencerLayout ran before it in the same process, it also
// reports its ratio to the raw "move" layout, which runs the same statement.
func BenchmarkSequenceAll(b *testing.B) {
	e := newEnv(b, true)
	sizes := []int{256, 4096}
	for range *rounds {
		for _, size := range sizes {
			b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) { benchDrain(b, e, size) })
		}
	}
	for _, size := range sizes {
		name := fmt.Sprintf("payload=%d", size)
		printMedians(b.Name(), []string{name}, []string{"msgs/s", "WAL-B/msg", "cpu-us/msg"})
		layout := fmt.Sprintf("BenchmarkSequencerLayout/payload=%d/move", size)
		move, okM := lookup(layout, "seq-msgs/s")
		real, okR := lookup(b.Name()+"/"+name, "msgs/s")
		moveCPU, okMC := lookup(layout, "seq-cpu-us/msg")
		realCPU, okRC := lookup(b.Name()+"/"+name, "cpu-us/msg")
		fmt.Printf("%s/%s: ratio of medians SequenceAll/raw move sequencing: msgs/s %s, cpu-us/msg %s\n",
			b.Name(), name, ratio(real, move, okR, okM), ratio(realCPU, moveCPU, okRC, okMC))
	}
}

func benchDrain(b *testing.B, e *env, size int) {
	b.StopTimer()
	b.ResetTimer()
	ph, err := runDrain(context.Background(), e, b, size, b.N)
	if err != nil {
		b.Fatal(err)
	}
	warnCheckpoints(b, "sequence", ph)
	m := map[string]float64{"msgs/s": ph.rate(), "WAL-B/msg": ph.walPerMsg()}
	addCPU(m, "", ph)
	if raw, ok := lookup(fmt.Sprintf("BenchmarkSequencerLayout/payload=%d/move", size), "seq-msgs/s"); ok {
		m["x-raw-move"] = ph.rate() / raw
	}
	report(b, m)
}

package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/adaptive"
)

// publishRound is one publish-only run of (a) or (c) in the interleaved
// rounds: a fresh schema, the publishers alone, no relay.
type publishRound struct {
	System              string  `json:"system"`
	PerTx               int     `json:"per_tx"`
	Round               int     `json:"round"`
	Messages            int     `json:"messages"`
	Seconds             float64 `json:"seconds"`
	Rate                float64 `json:"msgs_per_s"`
	CPUMicrosPerMessage float64 `json:"cpu_us_per_msg"`
}

// publishSummary is the median (and range) of the rounds of one system at
// one messages-per-transaction value, and (for (c)) its ratio to (a).
type publishSummary struct {
	System        string    `json:"system"`
	PerTx         int       `json:"per_tx"`
	Rounds        int       `json:"rounds"`
	MedianRate    float64   `json:"median_msgs_per_s"`
	MinRate       float64   `json:"min_msgs_per_s"`
	MaxRate       float64   `json:"max_msgs_per_s"`
	MedianCPU     float64   `json:"median_cpu_us_per_msg"`
	RatioToA      float64   `json:"ratio_to_ceiling,omitempty"`
	CPURatioToA   float64   `json:"cpu_ratio_to_ceiling,omitempty"` // (a)'s CPU per message ÷ this one's
	RatioOfRounds []float64 `json:"ratio_per_round,omitempty"`      // (c)/(a) of each round
}

// roundMessages is how many messages one publish round writes at perTx:
// -messages, but at most 20,000 transactions, so that the 1/tx rounds take
// seconds, not minutes.
func (b *bench) roundMessages(perTx int) int {
	return min(b.cfg.messages, 20000*perTx)
}

// publishRoundsPhase publishes with (a) and (c) alternately, -publish-rounds
// times per -per-tx value, the publishers alone, and reports medians: one
// publish run is a few seconds of durable commits, whose rate varies from
// run to run far more than the ratio of two runs next to each other does.
func (b *bench) publishRoundsPhase(ctx context.Context, res *results) error {
	names := []string{sysCeiling, sysOutbox}
	if slices.Contains(b.cfg.systems, sysOutboxWAL) {
		names = append(names, sysOutboxWAL)
	}
	for _, perTx := range b.cfg.perTx {
		for round := 1; round <= b.cfg.publishRounds; round++ {
			for _, name := range names {
				r, err := b.runPublishRound(ctx, name, perTx, round)
				if err != nil {
					return fmt.Errorf("publish round %d, %s, %d/tx: %w", round, name, perTx, err)
				}
				res.PublishRounds = append(res.PublishRounds, r)
			}
		}
	}
	res.PublishSummary = summarizeRounds(res.PublishRounds, b.cfg.perTx)
	return nil
}

func (b *bench) runPublishRound(ctx context.Context, name string, perTx, round int) (*publishRound, error) {
	schema := fmt.Sprintf("round_%s_pt%d_r%d", strings.ReplaceAll(name, "-", "_"), perTx, round)
	if err := b.createSchema(ctx, schema); err != nil {
		return nil, err
	}
	defer func() {
		_, _ = b.admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	// No relay is started: only the publish path is set up and measured.
	sys, err := b.setup(ctx, name, schema, "round", nil, outboxOptions{partitions: b.cfg.partitions, tuning: adaptive.Default()})
	if err != nil {
		return nil, err
	}
	if sys.stop != nil {
		defer sys.stop()
	}
	pool, err := b.warmPool(ctx, b.cfg.publishers)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := b.beforeRun(ctx); err != nil {
		return nil, err
	}
	txs := (b.roundMessages(perTx) + perTx - 1) / perTx
	r := &publishRound{System: name, PerTx: perTx, Round: round, Messages: txs * perTx}
	cpu0 := readCPU(b.postmaster)
	t0 := time.Now()
	l := &load{sys: sys, pool: pool, perTx: perTx, workers: b.cfg.publishers, t0: t0}
	if err := b.publish(ctx, l, unpaced(ctx, txs, nil)); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)
	cpu1 := readCPU(b.postmaster)
	r.Seconds = elapsed.Seconds()
	r.Rate = float64(r.Messages) / r.Seconds
	r.CPUMicrosPerMessage = ((cpu1.process - cpu0.process) + (cpu1.server - cpu0.server)).Seconds() * 1e6 / float64(r.Messages)
	logf("publish round %d, %s, %d msg/tx: %d messages in %.2f s: %.0f msg/s, CPU %.1f µs/msg", round, name, perTx, r.Messages, r.Seconds, r.Rate, r.CPUMicrosPerMessage)
	return r, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summarizeRounds computes the medians per system and -per-tx value, and
// (c)'s ratios to (a): of the medians, and round by round.
func summarizeRounds(rounds []*publishRound, perTxs []int) []publishSummary {
	var out []publishSummary
	for _, perTx := range perTxs {
		byRound := map[string]map[int]*publishRound{}
		var sums []publishSummary
		for _, name := range []string{sysCeiling, sysOutbox, sysOutboxWAL} {
			var rates, cpus []float64
			byRound[name] = map[int]*publishRound{}
			for _, r := range rounds {
				if r.System == name && r.PerTx == perTx {
					rates, cpus = append(rates, r.Rate), append(cpus, r.CPUMicrosPerMessage)
					byRound[name][r.Round] = r
				}
			}
			if len(rates) == 0 {
				continue
			}
			sums = append(sums, publishSummary{System: name, PerTx: perTx, Rounds: len(rates), MedianRate: median(rates),
				MinRate: slices.Min(rates), MaxRate: slices.Max(rates), MedianCPU: median(cpus)})
		}
		if len(sums) >= 2 && sums[0].System == sysCeiling {
			a := &sums[0]
			for i := range sums[1:] {
				c := &sums[1+i]
				c.RatioToA, c.CPURatioToA = div(c.MedianRate, a.MedianRate), div(a.MedianCPU, c.MedianCPU)
				for round, rc := range byRound[c.System] {
					if ra := byRound[sysCeiling][round]; ra != nil {
						c.RatioOfRounds = append(c.RatioOfRounds, div(rc.Rate, ra.Rate))
					}
				}
				slices.Sort(c.RatioOfRounds)
			}
		}
		out = append(out, sums...)
	}
	return out
}

// publishRoundsMarkdown renders the rounds' medians.
func (res *results) publishRoundsMarkdown(sb *strings.Builder) {
	fmt.Fprintf(sb, "## Publish alone, interleaved rounds\n\n(a) and (c) (and (e) when named) publish alternately, %v rounds per messages-per-transaction value, in a fresh schema each, with the publishers alone (no relay), %v publishers; at most 20,000 transactions per round. Medians, with the range over the rounds.\n\n",
		res.Config["publish_rounds"], res.Config["publishers"])
	sb.WriteString("| system | msg/tx | rounds | median msg/s | min..max msg/s | median CPU µs/msg | (c)/(a) of medians | (c)/(a) round by round | CPU per message (inverse) |\n|---|---:|---:|---:|---|---:|---:|---|---:|\n")
	for _, s := range res.PublishSummary {
		ratio, perRound, cpu := "—", "—", "—"
		if s.System != sysCeiling && s.RatioToA != 0 {
			ratio, cpu = fmt.Sprintf("**%.2f×**", s.RatioToA), fmt.Sprintf("%.2f×", s.CPURatioToA)
			var parts []string
			for _, q := range s.RatioOfRounds {
				parts = append(parts, fmt.Sprintf("%.2f", q))
			}
			perRound = strings.Join(parts, ", ")
		}
		fmt.Fprintf(sb, "| %s | %d | %d | %.0f | %.0f..%.0f | %.1f | %s | %s | %s |\n",
			systemLabel[s.System], s.PerTx, s.Rounds, s.MedianRate, s.MinRate, s.MaxRate, s.MedianCPU, ratio, perRound, cpu)
	}
	sb.WriteString("\n")
}

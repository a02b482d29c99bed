package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

type results struct {
	Started string         `json:"started"`
	Seconds float64        `json:"seconds"`
	Machine machineInfo    `json:"machine"`
	Config  map[string]any `json:"config"`
	Runs    []*runResult   `json:"runs"`
	Ratios  []ratio        `json:"ratios"`
}

type runResult struct {
	System     string `json:"system"`
	PerTx      int    `json:"per_tx"`
	Messages   int    `json:"messages"`
	Publishers int    `json:"publishers"`
	// Complete is false when not every message reached the broker within
	// -max-drain (the end-to-end rate then counts those that did).
	Complete        bool    `json:"complete"`
	PublishSeconds  float64 `json:"publish_seconds"`
	PublishRate     float64 `json:"publish_msgs_per_s"`
	AtBroker        int64   `json:"at_broker,omitempty"`
	EndToEndSeconds float64 `json:"end_to_end_seconds,omitempty"`
	EndToEndRate    float64 `json:"end_to_end_msgs_per_s,omitempty"`
	// CPU over the whole run (until the last message reached the broker):
	// this process (publishers, relay, in-process Kafka broker) and the
	// PostgreSQL server processes.
	ProcessCPUSeconds   float64  `json:"process_cpu_s"`
	PostgresCPUSeconds  float64  `json:"postgres_cpu_s"`
	CPUSeconds          float64  `json:"cpu_s"`
	CPUMicrosPerMessage float64  `json:"cpu_us_per_msg"`
	PeakRSSBytes        int64    `json:"peak_rss_bytes"`
	Samples             []sample `json:"samples,omitempty"`
}

// sample is the state of a run at T seconds after its first publish.
type sample struct {
	T         float64 `json:"t"`
	Published int64   `json:"published"`
	AtBroker  int64   `json:"at_broker"`
}

type ratio struct {
	PerTx int    `json:"per_tx"`
	Name  string `json:"name"`
	// Publish compares publish msg/s, EndToEnd end-to-end msg/s, CPU the
	// CPU time per message (other/this: above 1 means this system needs
	// less CPU per message).
	Publish  float64 `json:"publish"`
	EndToEnd float64 `json:"end_to_end,omitempty"`
	CPU      float64 `json:"cpu_per_msg"`
}

func jsonConfig(c config) map[string]any {
	return map[string]any{
		"messages": c.messages, "payload": c.payload, "keys": c.keys, "partitions": c.partitions,
		"per_tx": c.perTx, "publishers": c.publishers, "max_drain": c.maxDrain.String(), "smoke": c.smoke,
		"outbox_notify": c.outboxNotify,
	}
}

func find(runs []*runResult, sys string, perTx int) *runResult {
	for _, r := range runs {
		if r.System == sys && r.PerTx == perTx {
			return r
		}
	}
	return nil
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ratios(runs []*runResult, perTxs []int) []ratio {
	var out []ratio
	for _, n := range perTxs {
		a, b, c := find(runs, sysCeiling, n), find(runs, sysPeer, n), find(runs, sysOutbox, n)
		if a == nil || b == nil || c == nil {
			continue
		}
		out = append(out,
			ratio{PerTx: n, Name: "(c)/(a) outbox / plain INSERT", Publish: div(c.PublishRate, a.PublishRate),
				CPU: div(a.CPUMicrosPerMessage, c.CPUMicrosPerMessage)},
			ratio{PerTx: n, Name: "(c)/(b) outbox / watermill-sql + forwarder", Publish: div(c.PublishRate, b.PublishRate),
				EndToEnd: div(c.EndToEndRate, b.EndToEndRate), CPU: div(b.CPUMicrosPerMessage, c.CPUMicrosPerMessage)})
	}
	return out
}

func (res *results) write(dir string) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(res.markdown()), 0o644); err != nil {
		return err
	}
	return writePlot(filepath.Join(dir, "throughput.png"), res.Runs)
}

var systemLabel = map[string]string{
	sysCeiling: "(a) plain INSERT (ceiling)",
	sysPeer:    "(b) watermill-sql + forwarder → Kafka",
	sysOutbox:  "(c) watermill-outbox → Kafka",
}

func (res *results) markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Machine: %s; %s.\n\n", res.Machine.String(), res.Machine.PostgreSQL)
	fmt.Fprintf(&sb, "Workload: %v messages per system and run, %v-byte payloads, %v keys, %v partitions, %v publishers.\n\n",
		res.Config["messages"], res.Config["payload"], res.Config["keys"], res.Config["partitions"], res.Config["publishers"])
	sb.WriteString("| system | msg/tx | publish msg/s | end-to-end msg/s | end-to-end s | CPU s (process + postgres) | CPU µs/msg | peak RSS MiB |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range res.Runs {
		e2e, e2es := "—", "—"
		if r.System != sysCeiling {
			e2e, e2es = fmt.Sprintf("%.0f", r.EndToEndRate), fmt.Sprintf("%.2f", r.EndToEndSeconds)
			if !r.Complete {
				e2e += fmt.Sprintf(" (incomplete: %d of %d)", r.AtBroker, r.Messages)
			}
		}
		fmt.Fprintf(&sb, "| %s | %d | %.0f | %s | %s | %.1f (%.1f + %.1f) | %.1f | %d |\n",
			systemLabel[r.System], r.PerTx, r.PublishRate, e2e, e2es, r.CPUSeconds, r.ProcessCPUSeconds, r.PostgresCPUSeconds,
			r.CPUMicrosPerMessage, r.PeakRSSBytes>>20)
	}
	sb.WriteString("\n| msg/tx | ratio | publish msg/s | end-to-end msg/s | CPU per message (inverse) |\n|---:|---|---:|---:|---:|\n")
	for _, q := range res.Ratios {
		e2e := "—"
		if q.EndToEnd != 0 {
			e2e = fmt.Sprintf("**%.2f×**", q.EndToEnd)
		}
		fmt.Fprintf(&sb, "| %d | %s | %.2f× | %s | %.2f× |\n", q.PerTx, q.Name, q.Publish, e2e, q.CPU)
	}
	return sb.String()
}

package main

import (
	"fmt"
	"sync"
	"time"
)

// progress prints a line every second, from the start of publishing until
// the brokers' consumers have every message: what has been committed, rolled
// back, sequenced, forwarded to and received from each broker.
type progress struct {
	stopOnce sync.Once
	done     chan struct{} // closed to stop
	finished chan struct{} // closed when the printer has stopped
}

const progressFormat = "   %6s  %9s  %11s  %9s  %15s  %8s  %14s  %8s\n"

// startProgress prints the header and starts the printer.
func (d *demo) startProgress() {
	p := &progress{done: make(chan struct{}), finished: make(chan struct{})}
	d.progress = p
	fmt.Fprintf(d.out, progressFormat, "time", "committed", "rolled back", "sequenced",
		"Kafka forwarded", "received", "NATS forwarded", "received")
	go func() {
		defer close(p.finished)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
				d.progressLine()
			}
		}
	}()
	d.onClose(func() { p.stop() })
}

// stopProgress stops the printer and prints a last line.
func (d *demo) stopProgress() {
	if d.progress != nil && d.progress.stop() {
		d.progressLine()
	}
}

// stop stops the printer; it returns true the first time.
func (p *progress) stop() bool {
	first := false
	p.stopOnce.Do(func() {
		close(p.done)
		<-p.finished
		first = true
	})
	return first
}

func (d *demo) progressLine() {
	c := &d.published.counts
	n := func(v int64) string { return fmt.Sprint(v) }
	fmt.Fprintf(d.out, progressFormat,
		fmt.Sprintf("%.1fs", time.Since(d.publishStart).Seconds()),
		n(c.committedMsgs.Load()), n(c.rolledBackMsgs.Load()), n(d.sequencer.Stats().Sequenced),
		n(d.forwarded.kafka.Stats().Messages), n(d.kafkaIn.unique.Load()),
		n(d.forwarded.nats.Stats().Messages), n(d.natsIn.unique.Load()))
}

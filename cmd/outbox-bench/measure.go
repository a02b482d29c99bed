package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/watermill-outbox/internal/procstat"
)

// cpuSample is the CPU time used so far by this process and by the
// PostgreSQL server.
type cpuSample struct{ process, server time.Duration }

// total is the sum of both, in seconds.
func (c cpuSample) total() float64 { return (c.process + c.server).Seconds() }

// readCPU returns the CPU time (user + system) of this process (which holds
// the in-process Kafka broker too) and of the PostgreSQL server whose
// postmaster is postmaster: its live processes and the children it reaped.
func readCPU(postmaster int) cpuSample {
	server, process, _ := procstat.CPU(postmaster)
	return cpuSample{process: process, server: server}
}

// resetPeakRSS resets this process's peak RSS (VmHWM) so that each run
// reports its own; where that is not possible, peakRSS falls back to
// getrusage's maximum over the whole process.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is this process's peak resident set size in bytes since the last
// resetPeakRSS (VmHWM), or since it started (getrusage) without /proc.
func peakRSS() int64 {
	if kb, ok := procStatusKB("VmHWM:"); ok {
		return kb << 10
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		return ru.Maxrss << 10
	}
	return 0
}

// currentRSS is this process's resident set size in bytes now (VmRSS), 0
// without /proc.
func currentRSS() int64 {
	kb, _ := procStatusKB("VmRSS:")
	return kb << 10
}

// procStatusKB reads a "<field> <n> kB" line of /proc/self/status.
func procStatusKB(field string) (int64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb, err == nil
		}
	}
	return 0, false
}

// heapInuse is the Go heap in use (runtime.MemStats.HeapInuse), in bytes.
func heapInuse() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// brokerCounter counts the records of a topic a consumer can read: a
// franz-go consumer with isolation level read_committed, started on the
// first Count of the topic, counts what it fetches. End offsets would not
// do: an exactly-once forwarder's commit markers take offsets too (one per
// batch and partition), and a record counts as at the broker only once
// its transaction committed.
type brokerCounter struct {
	brokers []string

	mu     sync.Mutex
	topics map[string]*topicCount
}

type topicCount struct {
	client *kgo.Client
	n      atomic.Int64
	err    atomic.Pointer[error]
	cancel context.CancelFunc
	done   chan struct{}
}

func newBrokerCounter(brokers []string) *brokerCounter {
	return &brokerCounter{brokers: brokers, topics: map[string]*topicCount{}}
}

// Close stops the consumers.
func (c *brokerCounter) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tc := range c.topics {
		tc.cancel()
		<-tc.done
		tc.client.Close()
	}
	c.topics = map[string]*topicCount{}
}

// Count returns how many records of topic the consumer has read.
func (c *brokerCounter) Count(ctx context.Context, topic string) (int64, error) {
	c.mu.Lock()
	tc := c.topics[topic]
	if tc == nil {
		client, err := kgo.NewClient(
			kgo.SeedBrokers(c.brokers...),
			kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.FetchMaxWait(50*time.Millisecond),
		)
		if err != nil {
			c.mu.Unlock()
			return 0, err
		}
		cctx, cancel := context.WithCancel(context.Background())
		tc = &topicCount{client: client, cancel: cancel, done: make(chan struct{})}
		c.topics[topic] = tc
		go tc.run(cctx)
	}
	c.mu.Unlock()
	if err := tc.err.Load(); err != nil {
		return 0, *err
	}
	return tc.n.Load(), nil
}

func (tc *topicCount) run(ctx context.Context) {
	defer close(tc.done)
	for {
		fetches := tc.client.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			err = fmt.Errorf("consume %s/%d: %w", topic, p, err)
			tc.err.Store(&err)
		})
		tc.n.Add(int64(fetches.NumRecords()))
	}
}

// machineInfo describes where the benchmark ran.
type machineInfo struct {
	CPUs       int     `json:"cpus"`
	CPUModel   string  `json:"cpu_model"`
	MemoryGiB  float64 `json:"memory_gib"`
	Kernel     string  `json:"kernel"`
	Go         string  `json:"go"`
	PostgreSQL string  `json:"postgresql"`
	LoadAvg    string  `json:"loadavg_at_start"`
}

func (m machineInfo) String() string {
	return fmt.Sprintf("%d CPUs (%s), %.0f GiB RAM, Linux %s, %s, load average %s", m.CPUs, m.CPUModel, m.MemoryGiB, m.Kernel, m.Go, m.LoadAvg)
}

func describeMachine() machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemoryGiB = kb / (1 << 20)
		}
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

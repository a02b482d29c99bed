package kafka_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/forwarder/kafka"
	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/fwdtest"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// What one instance holds open to forward many outbox partitions exactly
// once: one transactional producer (one kgo client) for all of them, so
// connections and goroutines stay flat in the number of partitions.
// Measured after steady forwarding of 64 and of 256 partitions; the bounds
// asserted are those docs/forwarder.md states:
//
//   - one producer open;
//   - connections to the brokers: at most 3 per broker for the producer
//     (metadata, the transaction coordinator, produce requests) plus the
//     shared client's, up to 6 per broker (a seed connection and one for
//     each of kgo's request kinds, opened as requests need them);
//   - kgo goroutines: at most 40, whatever the partitions;
//   - and 256 partitions hold no more connections, and at most 10 more kgo
//     goroutines, than 64.
func TestManyPartitionsOnOneInstance(t *testing.T) {
	if _, err := os.Stat("/proc/self/net/tcp"); err != nil {
		t.Skip("counts sockets through /proc (Linux)")
	}
	small, big, ok := at64And256(t, false)
	if !ok {
		return
	}
	t.Logf("64 partitions: %v", small)
	t.Logf("256 partitions: %v", big)
	if big.conns > small.conns {
		t.Errorf("256 partitions hold %d connections to the brokers, 64 held %d: not flat", big.conns, small.conns)
	}
	if big.kgoGoroutines > small.kgoGoroutines+10 {
		t.Errorf("256 partitions run %d kgo goroutines, 64 ran %d: not flat", big.kgoGoroutines, small.kgoGoroutines)
	}
}

// A forwarder-only topic (outbox.ForwardOnly) is forwarded by one loop per
// topic, not a Worker per partition: the goroutines of the process (but
// the in-process broker's) stay flat in the number of partitions too.
func TestManyPartitionsForwardOnly(t *testing.T) {
	if _, err := os.Stat("/proc/self/net/tcp"); err != nil {
		t.Skip("counts sockets through /proc (Linux)")
	}
	small, big, ok := at64And256(t, true)
	if !ok {
		return
	}
	t.Logf("64 partitions: %v", small)
	t.Logf("256 partitions: %v", big)
	if big.conns > small.conns {
		t.Errorf("256 partitions hold %d connections to the brokers, 64 held %d: not flat", big.conns, small.conns)
	}
	if g, s := big.goroutines-big.kfake, small.goroutines-small.kfake; g > s+10 {
		t.Errorf("256 partitions run %d goroutines (beyond the broker's), 64 ran %d: not flat", g, s)
	}
}

// at64And256 measures forwardPartitions at 64 and at 256 partitions
// (subtests); ok is false when one failed.
func at64And256(t *testing.T, forwardOnly bool) (small, big snapshot, ok bool) {
	at := map[int]snapshot{}
	for _, partitions := range []int{64, 256} {
		t.Run(strconv.Itoa(partitions), func(t *testing.T) {
			at[partitions] = forwardPartitions(t, partitions, forwardOnly)
		})
	}
	return at[64], at[256], !t.Failed()
}

// forwardPartitions forwards a topic of partitions outbox partitions
// exactly once on one instance and returns what forwarding holds open
// beyond what was open before (connections, kgo goroutines, heap growth).
func forwardPartitions(t *testing.T, partitions int, forwardOnly bool) snapshot {
	e := fwdtest.NewEnv(t)
	if forwardOnly {
		registerForwardOnly(t, e, "orders", partitions)
	} else {
		e.Register("orders", partitions)
	}
	c := kafkatest.New(t)
	topic := c.Topic(t, "orders", partitions, nil)
	brokers := len(c.Brokers)

	before := measure(t, c.Brokers)
	target := newTargetWith(t, kafka.Config{Brokers: c.Brokers})
	fwd := fwdtest.StartForwarder(t, e, nil, target, []string{"orders"}, func(cfg *forwarder.Config) {
		cfg.TargetTopic = func(string) string { return topic }
	})
	pub := fwdtest.NewPublisher(t, e)
	start := time.Now()
	stop, publishing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(publishing)
		for {
			pub.Round("orders", 2*partitions, nil) // every partition gets messages
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	outboxtest.WaitFor(t, "forwarding under way", 2*time.Minute, func() bool { return fwd.Stats().Messages >= int64(4*partitions) })
	loaded := measure(t, c.Brokers)
	loadedOpen := target.OpenProducers()
	close(stop)
	<-publishing
	// Kafka's committed records say what was forwarded, not the
	// forwarder's counter: a batch confirmed, whose cursor write then
	// failed (a deadline on a loaded machine), is confirmed and counted
	// again when it is delivered again (the tail read finds it in Kafka),
	// so the counter can pass the published count; it is read first only
	// because it is cheap.
	var inKafka []*kgo.Record
	outboxtest.WaitFor(t, "every message forwarded", 2*time.Minute, func() bool {
		if fwd.Stats().Messages < int64(pub.Count()) {
			return false
		}
		inKafka = c.ReadCommitted(t, topic)
		return len(inKafka) >= pub.Count()
	})
	ids := map[string]bool{}
	for _, r := range inKafka {
		id := kafkatest.Header(r, outbox.MetadataID)
		if ids[id] {
			t.Errorf("%s is in Kafka twice: not exactly once", id)
		}
		ids[id] = true
	}
	if len(ids) != pub.Count() {
		t.Errorf("%d distinct messages in Kafka, %d published", len(ids), pub.Count())
	}
	elapsed := time.Since(start)
	t.Logf("%d messages over %d partitions in %v (%.0f msg/s), %+v", pub.Count(), partitions, elapsed.Round(time.Millisecond), float64(pub.Count())/elapsed.Seconds(), fwd.Stats())
	t.Logf("before:     %v", before)
	t.Logf("forwarding: %v, %d producers open", loaded, loadedOpen)
	if loadedOpen != 1 {
		t.Errorf("%d producers open while forwarding, want 1", loadedOpen)
	}
	grown := snapshot{
		conns:         loaded.conns - before.conns,
		goroutines:    loaded.goroutines - before.goroutines,
		kgoGoroutines: loaded.kgoGoroutines - before.kgoGoroutines,
		kfake:         loaded.kfake - before.kfake,
		heap:          uint64(max(0, int64(loaded.heap)-int64(before.heap))),
	}
	if max := 3*brokers + sharedClientConns*brokers; grown.conns > max {
		t.Errorf("%d connections to the brokers, want at most %d (3 per broker for the producer, and the shared client's)", grown.conns, max)
	}
	if grown.kgoGoroutines > 40 {
		t.Errorf("%d kgo goroutines, want at most 40", grown.kgoGoroutines)
	}
	return grown
}

// sharedClientConns is the most connections per broker the forwarder's
// shared kgo client may hold: a seed connection and one per request kind
// kgo separates (normal, produce, fetch, group, slow).
const sharedClientConns = 6

type snapshot struct {
	conns         int    // this process's TCP connections to the brokers
	goroutines    int    // all of them
	kgoGoroutines int    // those running kgo code
	kfake         int    // those of the in-process kfake broker
	heap          uint64 // bytes in use after a GC
}

func (s snapshot) String() string {
	return fmt.Sprintf("%d connections to the brokers, %d goroutines (%d in kgo, %d of the in-process kfake broker), %d KiB heap", s.conns, s.goroutines, s.kgoGoroutines, s.kfake, s.heap/1024)
}

func measure(t *testing.T, brokers []string) snapshot {
	t.Helper()
	kgoG, kfake := stackCounts()
	goroutines := runtime.NumGoroutine()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return snapshot{conns: brokerConns(t, brokers), goroutines: goroutines, kgoGoroutines: kgoG, kfake: kfake, heap: ms.HeapAlloc}
}

// stackCounts counts the goroutines running kgo code and those of kfake.
// (A function of its own, so that its stack buffer is garbage when measure
// collects.)
//
//go:noinline
func stackCounts() (kgoG, kfake int) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		switch {
		case bytes.Contains(g, []byte("franz-go/pkg/kgo.")):
			kgoG++
		case bytes.Contains(g, []byte("franz-go/pkg/kfake.")):
			kfake++
		}
	}
	return kgoG, kfake
}

// brokerConns counts this process's established TCP connections whose
// remote end is one of brokers: the sockets of /proc/self/fd that
// /proc/self/net/tcp{,6} list with that remote port and address.
func brokerConns(t *testing.T, brokers []string) int {
	t.Helper()
	ours := map[string]bool{} // socket inodes of this process
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if link, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(link, "socket:[") {
			ours[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	want := map[string]bool{} // "port" of the brokers (addresses resolved below)
	for _, b := range brokers {
		_, port, err := net.SplitHostPort(b)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(port)
		want[fmt.Sprintf("%04X", p)] = true
	}
	n := 0
	for _, file := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "01" { // ESTABLISHED
				continue
			}
			remote := fields[2]
			port := remote[strings.LastIndexByte(remote, ':')+1:]
			if want[port] && ours[fields[9]] {
				n++
			}
		}
		f.Close()
	}
	return n
}

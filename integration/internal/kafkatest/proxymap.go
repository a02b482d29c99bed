package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ProxyMap puts a breakable Proxy in front of every address of a cluster's
// brokers — its seed brokers and every address the brokers advertise in
// their metadata — for clients in other processes (a test's child
// processes), which an Outage cannot reach: the test hands them Addrs, and
// they dial every broker connection through a MapDialer. A real broker
// answers with its advertised addresses, so a proxy in front of the seeds
// alone would see only the first connection of each client: the map
// covers the addresses the clients dial next too. Break takes the whole
// cluster away from those clients; Restore brings it back. It works the
// same on kfake and on a real cluster (whose advertised listeners must be
// reachable from the test's machine: the proxies dial them).
type ProxyMap struct {
	proxies    map[string]*Proxy // by broker address
	advertised []string
}

// NewProxyMap starts a Proxy for each seed broker of c, each address of
// extraSeeds (other addresses the clients are given as seeds, e.g. a
// front proxy), and each address the brokers advertise in c's metadata
// now; the proxies stop when the test ends. A broker that joins the
// cluster later has no proxy: a MapDialer refuses its address
// (ErrUnmapped).
func NewProxyMap(t testing.TB, c *Cluster, extraSeeds ...string) *ProxyMap {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, err := c.admin.ListBrokers(ctx)
	if err != nil {
		t.Fatalf("the brokers' advertised addresses: %v", err)
	}
	if len(brokers) == 0 {
		t.Fatal("the cluster's metadata lists no broker")
	}
	m := &ProxyMap{proxies: map[string]*Proxy{}}
	add := func(addr string) {
		if m.proxies[addr] == nil {
			m.proxies[addr] = NewProxy(t, addr)
		}
	}
	for _, b := range brokers {
		addr := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		add(addr)
		m.advertised = append(m.advertised, addr)
	}
	for _, seed := range append(append([]string(nil), c.Brokers...), extraSeeds...) {
		add(seed)
		if _, _, err := net.SplitHostPort(seed); err != nil {
			// kgo dials a seed without a port at Kafka's default port.
			m.proxies[net.JoinHostPort(seed, "9092")] = m.proxies[seed]
		}
	}
	sort.Strings(m.advertised)
	return m
}

// Addrs maps each broker address (seed or advertised) to the address of
// its proxy: give it to the clients' MapDialer.
func (m *ProxyMap) Addrs() map[string]string {
	out := make(map[string]string, len(m.proxies))
	for addr, p := range m.proxies {
		out[addr] = p.Addr()
	}
	return out
}

// Advertised returns the broker addresses of the cluster's metadata, in
// order.
func (m *ProxyMap) Advertised() []string { return append([]string(nil), m.advertised...) }

// Proxy returns the proxy of broker address addr (nil when it has none).
func (m *ProxyMap) Proxy(addr string) *Proxy { return m.proxies[addr] }

// Break cuts every connection through the proxies and refuses new ones: to
// the clients, every broker is gone.
func (m *ProxyMap) Break() {
	for _, p := range m.uniqueProxies() {
		p.Break()
	}
}

// Restore lets connections through every proxy again.
func (m *ProxyMap) Restore() {
	for _, p := range m.uniqueProxies() {
		p.Restore()
	}
}

func (m *ProxyMap) uniqueProxies() []*Proxy {
	seen := map[*Proxy]bool{}
	var out []*Proxy
	for _, p := range m.proxies {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// ErrUnmapped is returned by a MapDialer asked to dial an address its map
// has no proxy for (a broker that joined the cluster after the ProxyMap
// was made): dialing it directly would escape the test's outages.
var ErrUnmapped = errors.New("kafkatest: broker address not in the proxy map")

// MapDialer dials each broker address through its proxy (the Addrs of a
// ProxyMap, handed to the process the client runs in), for kgo (Option)
// and sarama (ConfigureSarama; watermill-kafka passes the sarama config on
// unchanged).
type MapDialer struct {
	// Addrs maps a broker address to the address to dial instead.
	Addrs map[string]string
	// Timeout bounds a dial (default 10 s). kgo.DialTimeout and sarama's
	// Net.DialTimeout do not apply to a dialer of one's own.
	Timeout time.Duration

	mu       sync.Mutex
	unmapped map[string]bool
	// OnUnmapped, when set, is called the first time an address is
	// refused with ErrUnmapped (for the client's log).
	OnUnmapped func(addr string)
}

// DialContext dials the proxy of address, or fails with ErrUnmapped.
func (d *MapDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	to, ok := d.Addrs[address]
	if !ok {
		d.mu.Lock()
		first := !d.unmapped[address]
		if d.unmapped == nil {
			d.unmapped = map[string]bool{}
		}
		d.unmapped[address] = true
		d.mu.Unlock()
		if first && d.OnUnmapped != nil {
			d.OnUnmapped(address)
		}
		return nil, fmt.Errorf("%w: %s (known: %v)", ErrUnmapped, address, d.Addrs)
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	nd := net.Dialer{Timeout: timeout}
	return nd.DialContext(ctx, network, to)
}

// Dial is DialContext without a context: sarama's Net.Proxy.Dialer.
func (d *MapDialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// Option is the kgo option that dials the brokers through d.
func (d *MapDialer) Option() kgo.Opt { return kgo.Dialer(d.DialContext) }

// ConfigureSarama makes sc dial the brokers through d (Net.Proxy).
func (d *MapDialer) ConfigureSarama(sc *sarama.Config) {
	sc.Net.Proxy.Enable = true
	sc.Net.Proxy.Dialer = d
}

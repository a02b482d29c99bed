package kafkatest

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Proxy is a local TCP proxy to one address that a test can break (every
// connection through it is cut and new ones are refused) and restore.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu     sync.Mutex
	broken bool
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// NewProxy starts a proxy to upstream on a loopback port; it stops when the
// test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Break cuts every connection through the proxy and refuses new ones until
// Restore.
func (p *Proxy) Break() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = false
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.Break()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.broken {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.track(c)
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c)
	}
}

// track registers c; p.mu is held.
func (p *Proxy) track(c net.Conn) { p.conns[c] = true }

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *Proxy) pipe(down net.Conn) {
	defer p.wg.Done()
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		p.untrack(down)
		return
	}
	p.mu.Lock()
	if p.broken {
		p.mu.Unlock()
		_ = up.Close()
		p.untrack(down)
		return
	}
	p.track(up)
	p.mu.Unlock()
	var once sync.WaitGroup
	once.Add(2)
	go func() { defer once.Done(); _, _ = io.Copy(up, down); p.untrack(up, down) }()
	go func() { defer once.Done(); _, _ = io.Copy(down, up); p.untrack(up, down) }()
	once.Wait()
}

// Outage routes a client's connections to the brokers through a Proxy per
// broker address, so that a test can take the whole cluster away from that
// client and bring it back, on kfake and on a real cluster alike. Give
// Dialer to the client (e.g. in the target's ClientOptions).
type Outage struct {
	t       testing.TB
	mu      sync.Mutex
	proxies map[string]*Proxy
	broken  bool
}

// NewOutage returns an Outage, not broken.
func NewOutage(t testing.TB) *Outage {
	return &Outage{t: t, proxies: map[string]*Proxy{}}
}

var errBroken = errors.New("kafkatest: outage")

// Dialer is the kgo option that dials the brokers through the proxies.
func (o *Outage) Dialer() kgo.Opt {
	return kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		o.mu.Lock()
		if o.broken {
			o.mu.Unlock()
			return nil, errBroken
		}
		p := o.proxies[host]
		if p == nil {
			p = NewProxy(o.t, host)
			o.proxies[host] = p
		}
		o.mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr())
	})
}

// Break cuts every connection to the brokers and refuses new ones.
func (o *Outage) Break() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.broken = true
	for _, p := range o.proxies {
		p.Break()
	}
}

// Restore ends the outage.
func (o *Outage) Restore() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.broken = false
	for _, p := range o.proxies {
		p.Restore()
	}
}

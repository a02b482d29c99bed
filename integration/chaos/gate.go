package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Gate is a TCP listener that can go through an outage: Down closes every
// connection it accepted and stops listening, so that clients are cut off
// and new connections are refused, and Up listens again on the same
// address. Given to a server as its listener (kfake.ListenFn), it makes
// the server unreachable for a while without losing the server's state: to
// its clients, a broker outage.
type Gate struct {
	addr     string // the address, fixed by the first Listen
	accepted chan net.Conn
	closed   chan struct{}

	mu      sync.Mutex
	ln      net.Listener // nil while down
	conns   map[net.Conn]struct{}
	isDown  bool
	isShut  bool
	outages int
	wg      sync.WaitGroup // the accept loops
}

// Listen starts a Gate on address (a TCP address; port 0 picks a free one,
// kept across outages). Its signature is that of net.Listen, for
// kfake.ListenFn, through a closure that keeps the Gate.
func Listen(network, address string) (*Gate, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	g := &Gate{
		addr:     ln.Addr().String(),
		accepted: make(chan net.Conn),
		closed:   make(chan struct{}),
		conns:    map[net.Conn]struct{}{},
	}
	g.serve(ln)
	return g, nil
}

// serve runs the accept loop of ln until ln is closed.
func (g *Gate) serve(ln net.Listener) {
	g.ln = ln
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			if g.ln != ln { // went down meanwhile
				g.mu.Unlock()
				_ = c.Close()
				continue
			}
			tc := &trackedConn{Conn: c, g: g}
			g.conns[tc] = struct{}{}
			g.mu.Unlock()
			select {
			case g.accepted <- tc:
			case <-g.closed:
				_ = tc.Close()
				return
			}
		}
	}()
}

// Accept waits for the next connection; while the Gate is down it waits
// for it to come up again. It fails once the Gate is closed.
func (g *Gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.accepted:
		return c, nil
	case <-g.closed:
		return nil, net.ErrClosed
	}
}

// Addr is the Gate's address, the same across outages.
func (g *Gate) Addr() net.Addr {
	a, err := net.ResolveTCPAddr("tcp", g.addr)
	if err != nil {
		panic(err) // it was a listener's address
	}
	return a
}

// Close stops the Gate for good and closes its connections.
func (g *Gate) Close() error {
	g.mu.Lock()
	if g.isShut {
		g.mu.Unlock()
		return nil
	}
	g.isShut = true
	close(g.closed)
	g.cut()
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// cut stops listening and closes the connections; g.mu is held.
func (g *Gate) cut() {
	if g.ln != nil {
		_ = g.ln.Close()
		g.ln = nil
	}
	for c := range g.conns {
		_ = c.(*trackedConn).Conn.Close()
		delete(g.conns, c)
	}
}

// Down starts an outage: every connection is closed, new ones are refused.
func (g *Gate) Down() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isShut || g.isDown {
		return
	}
	g.isDown = true
	g.outages++
	g.cut()
}

// Up ends an outage: the Gate listens again on its address. The port was
// the Gate's a moment ago; binding it again is retried until ctx ends.
func (g *Gate) Up(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.isShut {
			g.mu.Unlock()
			return net.ErrClosed
		}
		if !g.isDown {
			g.mu.Unlock()
			return nil
		}
		ln, err := net.Listen("tcp", g.addr)
		if err == nil {
			g.isDown = false
			g.serve(ln)
			g.mu.Unlock()
			return nil
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("gate: listen on %s again: %w (last error: %v)", g.addr, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Outage takes the Gate down for d (or until ctx ends) and up again.
func (g *Gate) Outage(ctx context.Context, d time.Duration) error {
	g.Down()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	upCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return g.Up(upCtx)
}

// Outages counts the outages so far.
func (g *Gate) Outages() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.outages
}

// trackedConn removes itself from its Gate when closed.
type trackedConn struct {
	net.Conn
	g    *Gate
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.g.mu.Lock()
		delete(c.g.conns, c)
		c.g.mu.Unlock()
	})
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

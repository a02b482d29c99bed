package chaos

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// An outage cuts the connections and refuses new ones; afterwards the
// same address serves again.
func TestGateOutage(t *testing.T) {
	g, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { // an echo server behind the gate
		defer close(served)
		for {
			c, err := g.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	echo := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		_, err := bufio.NewReader(c).ReadString('\n')
		return err
	}
	addr := g.Addr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c); err != nil {
		t.Fatal(err)
	}

	g.Down()
	if err := echo(c); err == nil {
		t.Fatal("a connection survived the outage")
	}
	if c2, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c2.Close()
		t.Fatal("a connection was accepted during the outage")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Addr().String() != addr || g.Outages() != 1 {
		t.Fatalf("after the outage: %s, %d outages", g.Addr(), g.Outages())
	}
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := echo(c3); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	<-served
}

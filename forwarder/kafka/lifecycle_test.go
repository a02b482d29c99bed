package kafka

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/watermill-outbox/internal/kafkadriver"
)

// A client left in doubt is closed on a goroutine of the target's, which
// Close waits for: here the first transaction fails to begin, and closing
// its producer is held until the test lets it go.
func TestCloseWaitsForAClientClosedInTheBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &doubtDriver{roundsDriver: &roundsDriver{}, closing: make(chan struct{}), release: make(chan struct{})}
		target := newTarget(Config{Brokers: []string{"fake:9092"}}, nil, func(watermill.LoggerAdapter) (kafkadriver.Driver, error) { return d, nil }, "test")
		if _, err := target.Send(context.Background(), "orders", roundsBatch(0, 1)); !errors.Is(err, errBeginRefused) {
			t.Fatalf("Send: %v, want the refused Begin", err)
		}
		<-d.closing // the dropped producer is being closed, held
		closed := make(chan struct{})
		go func() {
			_ = target.Close()
			close(closed)
		}()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a dropped client was being closed")
		default:
		}
		close(d.release)
		<-closed
		if n := d.closes.Load(); n < 1 {
			t.Fatalf("%d producers closed, want the dropped one", n)
		}
	})
}

// Close stops the idle sweep (synctest fails a test that leaves a
// goroutine of its bubble running) and cuts a linger short: a Send waiting
// to linger returns once the target closes.
func TestCloseEndsTheSweepAndTheLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &roundsDriver{hold: make(chan struct{})}
		close(d.hold)
		const forever = 1 << 62
		target := newTarget(Config{Brokers: []string{"fake:9092"}, Linger: forever}, nil, func(watermill.LoggerAdapter) (kafkadriver.Driver, error) { return d, nil }, "test")
		sent := make(chan error, 1)
		go func() {
			_, err := target.Send(context.Background(), "orders", roundsBatch(0, 1))
			sent <- err
		}()
		synctest.Wait() // lingering
		select {
		case err := <-sent:
			t.Fatalf("Send returned while lingering: %v", err)
		default:
		}
		start := time.Now() // the bubble's clock: it moves only when every goroutine waits
		if err := target.Close(); err != nil {
			t.Fatal(err)
		}
		<-sent
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("the Send lingered %v after Close: Close did not cut the linger short", waited)
		}
	})
}

// The target keeps no lifecycle of its own: no stop channel, no WaitGroup
// (internal/startstop's Service runs its goroutines).
func TestTargetHasNoHandRolledLifecycle(t *testing.T) {
	lifecycle := map[reflect.Type]bool{
		reflect.TypeFor[chan struct{}]():      true,
		reflect.TypeFor[sync.WaitGroup]():     true,
		reflect.TypeFor[*sync.WaitGroup]():    true,
		reflect.TypeFor[context.Context]():    true,
		reflect.TypeFor[context.CancelFunc](): true,
	}
	typ := reflect.TypeFor[Target]()
	for i := range typ.NumField() {
		if f := typ.Field(i); lifecycle[f.Type] {
			t.Errorf("Target.%s is a %v", f.Name, f.Type)
		}
	}
}

var errBeginRefused = errors.New("begin refused")

// doubtDriver's transactional producers refuse to begin a transaction
// (the target then drops the producer); closing the first one signals
// closing and waits for release.
type doubtDriver struct {
	*roundsDriver
	closing, release chan struct{}
	closes           atomic.Int32
}

func (d *doubtDriver) Transactional(string) (kafkadriver.Transactional, error) {
	return &doubtTxn{d: d}, nil
}

type doubtTxn struct {
	kafkadriver.Transactional // (only what is defined below is called)
	d                         *doubtDriver
}

func (x *doubtTxn) Init(context.Context) error { return nil }
func (x *doubtTxn) Begin() error               { return errBeginRefused }
func (x *doubtTxn) Close() {
	if x.d.closes.Add(1) == 1 {
		close(x.d.closing)
		<-x.d.release
	}
}

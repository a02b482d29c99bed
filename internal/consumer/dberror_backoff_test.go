package consumer

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// A database error backs the partition worker off with jitter, as a
// handler's failure does: the partitions an outage failed together do not
// all retry at the same instant.
func TestDatabaseErrorBackoffIsJittered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFakeStore("a")
		s.Fail["read"] = errors.New("connection reset by peer")
		var mu sync.Mutex
		var spread []time.Duration
		r := newRig(t, s, func(c *Config, _ *fakeLease) {
			c.Jitter = func(d time.Duration) time.Duration {
				mu.Lock()
				defer mu.Unlock()
				spread = append(spread, d)
				return d / 2
			}
		}, nil)
		r.unstopped = true // Run stops it, when the lease ends
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.w.Run()
		}()
		m := <-r.out // the read failed once, then succeeded: a was handed out
		m.Ack()
		time.Sleep(time.Second)
		r.lease.Cancel(errors.New("test over"))
		<-done
		mu.Lock()
		defer mu.Unlock()
		if len(spread) != 1 || spread[0] != r.cfg.Tuning.BackoffBase {
			t.Fatalf("jitter asked to spread %v; want the database error's backoff, %v, once", spread, r.cfg.Tuning.BackoffBase)
		}
	})
}

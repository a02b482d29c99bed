package lease_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/millrace/watermill-outbox/internal/lease"
)

// The pace of a manager's balances (its heartbeat): every BalanceInterval
// while the group changes or its changes cannot be heard; doubling up to
// MaxBalanceInterval while it is settled and they can; at once on a
// notification of a change of its group; right after another member's
// expiry; back to BalanceInterval when a lease of its own ends. Driven on
// an in-memory store under testing/synctest, so the times are exact.

// paceStore is a lease.Store in memory for one member, recording when it
// balanced (time since the test started). Only the statements a Run loop
// makes are implemented.
type paceStore struct {
	lease.Store // the fenced writes: never called here

	start      time.Time
	partitions int

	mu       sync.Mutex
	balances []time.Duration
	others   []string
	expireIn time.Duration // OthersExpireIn the next balances return
	held     map[int32]int64
	token    int64
}

func newPaceStore(partitions int) *paceStore {
	return &paceStore{start: time.Now(), partitions: partitions, held: map[int32]int64{}}
}

func (s *paceStore) CreateCursors(context.Context, lease.Group, int, bool) error     { return nil }
func (s *paceStore) ExpireMembers(context.Context, lease.Group, time.Duration) error { return nil }
func (s *paceStore) Leave(context.Context, lease.Group, string) error                { return nil }

func (s *paceStore) Balance(_ context.Context, _ lease.Group, _ string, _ time.Duration, partitions int) (lease.Balance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.balances = append(s.balances, time.Since(s.start))
	return lease.Balance{Others: slices.Clone(s.others), Active: partitions, OthersExpireIn: s.expireIn}, nil
}

func (s *paceStore) Acquire(_ context.Context, _ lease.Group, _ string, partitions int, exclude []int32, _ time.Duration, n int) ([]lease.Acquired, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []lease.Acquired
	for p := range int32(partitions) {
		if len(got) == n {
			break
		}
		if _, taken := s.held[p]; taken || slices.Contains(exclude, p) {
			continue
		}
		s.token++
		s.held[p] = s.token
		got = append(got, lease.Acquired{Partition: p, Token: s.token})
	}
	return got, nil
}

func (s *paceStore) Renew(_ context.Context, _ lease.Group, _ string, parts []int32, tokens []int64, _ time.Duration) (map[int32]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int32]bool{}
	for i, p := range parts {
		if s.held[p] == tokens[i] {
			out[p] = true
		}
	}
	return out, nil
}

func (s *paceStore) Release(_ context.Context, _ lease.Group, _ string, parts []int32, tokens []int64) ([]int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var freed []int32
	for i, p := range parts {
		if s.held[p] == tokens[i] {
			delete(s.held, p)
			freed = append(freed, p)
		}
	}
	return freed, nil
}

func (s *paceStore) StillHeld(context.Context, lease.Group, string, []int32, []int64) ([]int32, error) {
	return nil, nil
}

// takeBalances returns the balances so far and forgets them.
func (s *paceStore) takeBalances() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.balances
	s.balances = nil
	return out
}

func (s *paceStore) set(others []string, expireIn time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.others, s.expireIn = others, expireIn
}

// paceListening is the subscription of paceListen: the test sends the
// notifications and says whether they are heard.
type paceListening struct {
	channel string
	fn      func(string)
	live    atomic.Bool
	ended   atomic.Bool
}

func (l *paceListening) Live() bool { return l.live.Load() }
func (l *paceListening) Unlisten()  { l.ended.Store(true) }

// paceRun runs a manager on store with TTL 30 s, BalanceInterval 1 s and
// MaxBalanceInterval 10 s (a Subscriber's defaults), its subscription live
// when live, and returns the subscription and the leases acquired.
func paceRun(t *testing.T, store *paceStore, live bool) (*paceListening, func() []*lease.Lease) {
	t.Helper()
	sub := &paceListening{}
	sub.live.Store(live)
	m, err := lease.NewManager(lease.Config{
		Store: store, Group: "billing", Topic: "orders", Partitions: store.partitions, MemberID: "me",
		TTL: 30 * time.Second, RenewInterval: 6 * time.Second, BalanceInterval: time.Second, MaxBalanceInterval: 10 * time.Second,
		Listen: func(channel string, fn func(string)) lease.Listening {
			sub.channel, sub.fn = channel, fn
			return sub
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	var leases []*lease.Lease
	done := make(chan error, 1)
	go func() {
		done <- m.Run(ctx, func(l *lease.Lease) {
			mu.Lock()
			leases = append(leases, l)
			mu.Unlock()
			go func() { <-l.Context().Done(); l.Done() }()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if !sub.ended.Load() {
			t.Error("the subscription to the group's changes was not ended")
		}
	})
	synctest.Wait()
	return sub, func() []*lease.Lease {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(leases)
	}
}

func seconds(ss ...float64) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

func wantBalances(t *testing.T, store *paceStore, want []time.Duration) {
	t.Helper()
	if got := store.takeBalances(); !slices.Equal(got, want) {
		t.Fatalf("balanced at %v, want %v", got, want)
	}
}

func TestASettledMemberStretchesItsBalancesWhileChangesAreHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newPaceStore(4)
		sub, _ := paceRun(t, store, true)
		if sub.channel != "watermill_outbox_members" {
			t.Errorf("listened on %q, want the schema's members channel", sub.channel)
		}
		time.Sleep(40 * time.Second)
		synctest.Wait()
		// The first balance acquires (not settled), the second finds the
		// group as it was: the waits double from there to 10 s.
		wantBalances(t, store, seconds(0, 1, 3, 7, 15, 25, 35))
	})
}

func TestAMemberBalancesEverySecondWhileChangesAreNotHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newPaceStore(4)
		sub, _ := paceRun(t, store, false)
		time.Sleep(5500 * time.Millisecond)
		synctest.Wait()
		wantBalances(t, store, seconds(0, 1, 2, 3, 4, 5))

		// Heard again: it stretches from there; lost again: every second.
		sub.live.Store(true)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		wantBalances(t, store, seconds(6, 8, 12))
		sub.live.Store(false)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		wantBalances(t, store, seconds(20, 21, 22, 23, 24, 25))
	})
}

func TestANotificationOfTheGroupsChangeBalancesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newPaceStore(4)
		sub, _ := paceRun(t, store, true)
		time.Sleep(16 * time.Second) // balanced at 0, 1, 3, 7, 15: the next at 25
		synctest.Wait()
		store.takeBalances()

		// Another group's, another topic's: nothing.
		for _, other := range []string{"orders:shipping", "invoices:billing", "orders:billingx"} {
			sub.fn(other)
			synctest.Wait()
		}
		wantBalances(t, store, nil)

		// This topic's group, then the group's every topic (an admin
		// pause without a topic), then a reconnection (""): each at once,
		// and the pace starts again from a second.
		for _, payload := range []string{"orders:billing", ":billing", ""} {
			store.set([]string{"other-" + payload}, 0) // a join: not settled
			sub.fn(payload)
			synctest.Wait()
			wantBalances(t, store, seconds(16))
		}
		store.set([]string{"other-"}, 0)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		wantBalances(t, store, seconds(17, 19))
	})
}

func TestAMemberLooksWhenAnotherMembersHeartbeatExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newPaceStore(4)
		store.set([]string{"other"}, 30*time.Second)
		paceRun(t, store, true)
		time.Sleep(8 * time.Second) // 0, 1, 3, 7: settled with its share, 2 of 4
		synctest.Wait()
		wantBalances(t, store, seconds(0, 1, 3, 7))

		// The other member stops heartbeating: at the balance of 15 s it
		// expires in 2.5 s. The next balance comes right after that, not
		// at 25 s, and takes its partitions.
		store.set([]string{"other"}, 2500*time.Millisecond)
		time.Sleep(8 * time.Second)
		synctest.Wait()
		wantBalances(t, store, seconds(15))
		store.set(nil, 0)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		wantBalances(t, store, seconds(17.51, 18.51))
		if n := len(store.held); n != 4 {
			t.Errorf("holds %d partitions after the other member expired, want 4", n)
		}
	})
}

func TestAMemberWhoseLeaseEndsBalancesWithinASecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newPaceStore(4)
		_, leases := paceRun(t, store, true)
		time.Sleep(16 * time.Second) // 0, 1, 3, 7, 15: the next at 25
		synctest.Wait()
		store.takeBalances()
		if n := len(leases()); n != 4 {
			t.Fatalf("%d leases, want 4", n)
		}

		// A worker stops on its own (its partition is released): the
		// partition is taken again at the next balance, a second later.
		leases()[2].Done()
		synctest.Wait()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		wantBalances(t, store, seconds(17))
		if n := len(leases()); n != 5 {
			t.Fatalf("%d leases acquired, want the released one again (5)", n)
		}
	})
}

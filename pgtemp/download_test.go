package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentRepository accepts connections and never answers. accepted is
// closed when it has accepted the first connection, dropped when the
// client has closed it.
func silentRepository(t *testing.T) (repo string, accepted, dropped <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	acc, drop := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			first := false
			once.Do(func() { first = true; close(acc) })
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c) // until the client closes it
				if first {
					close(drop)
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + l.Addr().String() + "/maven2", acc, drop
}

// halfRepository announces a jar of 1 MiB, sends half of it and then
// nothing. dropped is closed when the client has gone.
func halfRepository(t *testing.T) (repo string, dropped <-chan struct{}) {
	t.Helper()
	drop, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, ".jar") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", "1048576")
		_, _ = w.Write(make([]byte, 512<<10))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // the client closed the connection
			once.Do(func() { close(drop) })
		case <-release: // the test is over
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // first: srv.Close waits for the handler
	return srv.URL + "/maven2", drop
}

// noFetchDirs fails the test when the cache holds anything but the lock
// file: a .fetch-* directory left by a failed fetch, or a tree.
func noFetchDirs(t *testing.T, cache string) {
	t.Helper()
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != ".lock" {
			t.Errorf("the cache holds %s after the failed fetch", e.Name())
		}
	}
}

// waitFor waits for ch, failing the test when ctx ends first.
func waitFor(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("%s: %v", what, ctx.Err())
	}
}

// A repository that accepts the connection and never answers, or sends
// half the jar and then nothing, fails the fetch with ErrFetch once nothing
// has arrived for StallTimeout: the connection is closed and the temporary
// directory removed.
func TestAStalledDownloadFailsAfterTheStallTimeoutAndLeavesNothing(t *testing.T) {
	asOnAMachineWithGoOnly(t)
	const stall = 300 * time.Millisecond
	for _, c := range []struct {
		name  string
		serve func(t *testing.T) (string, <-chan struct{})
	}{
		{"accepts and never answers", func(t *testing.T) (string, <-chan struct{}) {
			repo, _, dropped := silentRepository(t)
			return repo, dropped
		}},
		{"sends half the jar, then nothing", halfRepository},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The test's own bound: the fetch must end by itself long before.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			repo, dropped := c.serve(t)
			cache := t.TempDir()
			var progress bytes.Buffer
			began := time.Now()
			_, err := Fetch(ctx, FetchOptions{Repository: repo, Version: testVersion, CacheDir: cache, Progress: &progress, StallTimeout: stall})
			took := time.Since(began)
			if !errors.Is(err, ErrFetch) || !errors.Is(err, errStalled) {
				t.Fatalf("Fetch: %v, want ErrFetch for a stall", err)
			}
			if took < stall {
				t.Fatalf("Fetch failed after %v, before the stall timeout %v", took, stall)
			}
			if !strings.Contains(err.Error(), stall.String()) {
				t.Errorf("the error does not say how long nothing arrived: %v", err)
			}
			waitFor(t, ctx, dropped, "the repository's connection is not closed")
			noFetchDirs(t, cache)
			t.Logf("%v after %v; progress %q", err, took.Round(time.Millisecond), progress.String())
		})
	}
}

// A caller that gives up (its context ends) while the download waits gets
// ErrFetch with the context's error at once, with the connection closed
// and the temporary directory removed.
func TestACancelledFetchStopsTheDownloadAndLeavesNothing(t *testing.T) {
	asOnAMachineWithGoOnly(t)
	bound, cancelBound := context.WithTimeout(context.Background(), time.Minute)
	defer cancelBound()
	repo, accepted, dropped := silentRepository(t)
	cache := t.TempDir()
	ctx, cancel := context.WithCancel(bound)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := Fetch(ctx, FetchOptions{Repository: repo, Version: testVersion, CacheDir: cache, Progress: io.Discard, StallTimeout: time.Hour})
		errc <- err
	}()
	waitFor(t, bound, accepted, "the fetch did not connect")
	cancel()
	var err error
	select {
	case err = <-errc:
	case <-bound.Done():
		t.Fatal("Fetch did not return after its context was cancelled")
	}
	if !errors.Is(err, ErrFetch) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch: %v, want ErrFetch and context.Canceled", err)
	}
	waitFor(t, bound, dropped, "the repository's connection is not closed")
	noFetchDirs(t, cache)
}

// Offline, the error names the ways out (a reachable mirror, an installed
// PostgreSQL, PG_BINDIR) and keeps the network error for errors.As; Start
// fails with it too.
func TestAnUnreachableRepositorySaysTheWaysOutAndKeepsTheCause(t *testing.T) {
	asOnAMachineWithGoOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there any more: connection refused
	cache := t.TempDir()
	opts := FetchOptions{Repository: srv.URL, Version: testVersion, CacheDir: cache, Progress: io.Discard}
	_, ferr := Fetch(ctx, opts)
	_, serr := Start(ctx, Options{Fetch: opts})
	for name, err := range map[string]error{"Fetch": ferr, "Start": serr} {
		if !errors.Is(err, ErrFetch) {
			t.Fatalf("%s: %v, want ErrFetch", name, err)
		}
		for _, way := range []string{EnvRepository + " ", "apt-get install postgresql", EnvBinDir + " "} {
			if !strings.Contains(err.Error(), way) {
				t.Errorf("%s: the error does not name %q: %v", name, way, err)
			}
		}
		var opErr *net.OpError
		var urlErr *url.Error
		if !errors.As(err, &opErr) || !errors.As(err, &urlErr) {
			t.Errorf("%s: the network error is not kept (errors.As finds no *net.OpError, *url.Error): %v", name, err)
		}
	}
	noFetchDirs(t, cache)
}

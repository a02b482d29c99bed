package schematest

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// StandIn is an in-process stand-in for a Confluent-compatible Schema
// Registry: the REST subset franz-go's sr.Client uses (subjects, versions,
// schemas by id, lookup, delete, config and compatibility), with
// compatibility really checked for Avro, Protobuf and JSON Schema. Its
// state lives in memory and survives Down and Up.
//
// The zero value is ready to use, as is NewStandIn's. All methods are safe
// for concurrent use.
type StandIn struct {
	requests atomic.Int64

	initOnce sync.Once
	reg      *store
	handler  http.Handler

	mu      sync.Mutex
	started bool
	closed  bool
	addr    string       // the listening address, kept across Down and Up
	srv     *http.Server // nil while down
	running sync.WaitGroup
}

// NewStandIn returns a stand-in that is not listening yet: call Start, or
// serve its Handler yourself.
func NewStandIn() *StandIn { return &StandIn{} }

func (s *StandIn) init() {
	s.initOnce.Do(func() {
		s.reg = newStore()
		s.handler = s.reg.routes(&s.requests)
	})
}

// Handler returns the stand-in's REST surface, for an application that
// serves it on a listener of its own. Requests it serves count in
// Requests. On a nil *StandIn it returns a handler that answers every
// request with a Confluent-style error body.
func (s *StandIn) Handler() http.Handler {
	if s == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, &apiError{status: http.StatusInternalServerError, code: 50001, msg: ErrNilStandIn.Error()})
		})
	}
	s.init()
	return s.handler
}

// Start listens on a free port of the loopback address 127.0.0.1 (never
// on other interfaces) and serves the stand-in there until Down or Close.
// It returns the base URL to give to sr.URLs.
func (s *StandIn) Start() (url string, err error) {
	if s == nil {
		return "", ErrNilStandIn
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return "", ErrClosed
	case s.started:
		return "", ErrAlreadyStarted
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrListen, err)
	}
	s.started = true
	s.addr = ln.Addr().String()
	s.serve(ln)
	return "http://" + s.addr, nil
}

// serve serves the stand-in on ln until its server is closed. s.mu is held.
func (s *StandIn) serve(ln net.Listener) {
	var conns sync.WaitGroup
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: time.Minute,
		// Every connection is counted until its goroutine is done with it,
		// so that Down and Close leave no goroutine behind.
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				conns.Done()
			}
		},
	}
	s.srv = srv
	s.running.Add(1)
	conns.Add(1) // held by Serve, so that StateNew never adds to a zero count that Wait may see
	go func() {
		defer s.running.Done()
		_ = srv.Serve(ln) // returns http.ErrServerClosed once Down or Close closes srv
		conns.Done()
		conns.Wait()
	}()
}

// stop closes the server, if any, and waits for its goroutines. s.mu is
// held.
func (s *StandIn) stop() {
	if s.srv == nil {
		return
	}
	_ = s.srv.Close() // closes the listener and every connection, idle or not
	s.srv = nil
	s.running.Wait()
}

// Down stops listening, as a registry that went away: connections are
// closed and new ones refused. The stand-in keeps its schemas and its
// address; Up serves them again. Down on a stand-in that is down does
// nothing.
func (s *StandIn) Down() error {
	if s == nil {
		return ErrNilStandIn
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startedLocked(); err != nil {
		return err
	}
	s.stop()
	return nil
}

// startedLocked refuses a stand-in that is closed or was never started;
// s.mu is held.
func (s *StandIn) startedLocked() error {
	switch {
	case s.closed:
		return ErrClosed
	case !s.started:
		return ErrNotStarted
	}
	return nil
}

// Up listens again, after Down, on the address Start chose, with the
// state the stand-in had. Up on a stand-in that is up does nothing. It
// fails with ErrListen if another listener took the address meanwhile.
func (s *StandIn) Up() error {
	if s == nil {
		return ErrNilStandIn
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.startedLocked(); err != nil || s.srv != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("%w: %s again: %w", ErrListen, s.addr, err)
	}
	s.serve(ln)
	return nil
}

// Close stops the stand-in for good and waits for its goroutines to end.
// Closing a closed (or never started) stand-in returns nil.
func (s *StandIn) Close() error {
	if s == nil {
		return ErrNilStandIn
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.stop()
	return nil
}

// Requests returns the number of HTTP requests the stand-in has served so
// far (by Start's listener or through Handler): a test compares two
// readings to prove that code does not ask the registry once per message.
// A nil *StandIn has served none.
func (s *StandIn) Requests() int64 {
	if s == nil {
		return 0
	}
	return s.requests.Load()
}

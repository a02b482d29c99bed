package apicheck_test

import (
	"net/http"
	"net/http/httptest"

	"github.com/millrace/watermill-outbox/schema/schematest"
)

// cleanupTB is a fakeTB that runs its cleanups when told: schematest.New
// starts a stand-in that its cleanup closes.
type cleanupTB struct {
	fakeTB
	cleanups []func()
}

func (c *cleanupTB) Cleanup(fn func()) { c.cleanups = append(c.cleanups, fn) }

func (c *cleanupTB) runCleanups() {
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
}

// serve sends one request to h.
func serve(h http.Handler) {
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/subjects", nil))
}

// schematestEntries sweep package schematest: nil and zero StandIns and
// Registries, a nil testing.TB where the package documents what it does
// with one.
var schematestEntries = []entry{
	{"schematest.NewStandIn", func(e *env) {
		e.may("NewStandIn().Close", func() error { return schematest.NewStandIn().Close() })
	}},
	{"schematest.StandIn.Start", func(e *env) {
		e.fails("(*StandIn)(nil).Start", func() error { _, err := (*schematest.StandIn)(nil).Start(); return err })
		e.may("StandIn{}.Start", func() error {
			s := new(schematest.StandIn)
			_, err := s.Start()
			_ = s.Close()
			return err
		})
	}},
	{"schematest.StandIn.Handler", func(e *env) {
		e.call("(*StandIn)(nil).Handler", func() { serve((*schematest.StandIn)(nil).Handler()) })
		e.call("StandIn{}.Handler", func() { serve(new(schematest.StandIn).Handler()) })
	}},
	{"schematest.StandIn.Down", func(e *env) {
		e.fails("(*StandIn)(nil).Down", func() error { return (*schematest.StandIn)(nil).Down() })
		e.fails("StandIn{}.Down", func() error { return new(schematest.StandIn).Down() })
	}},
	{"schematest.StandIn.Up", func(e *env) {
		e.fails("(*StandIn)(nil).Up", func() error { return (*schematest.StandIn)(nil).Up() })
		e.fails("StandIn{}.Up", func() error { return new(schematest.StandIn).Up() })
	}},
	{"schematest.StandIn.Close", func(e *env) {
		e.fails("(*StandIn)(nil).Close", func() error { return (*schematest.StandIn)(nil).Close() })
		e.may("StandIn{}.Close", func() error { return new(schematest.StandIn).Close() })
	}},
	{"schematest.StandIn.Requests", func(e *env) {
		e.call("(*StandIn)(nil).Requests", func() { _ = (*schematest.StandIn)(nil).Requests() })
		e.call("StandIn{}.Requests", func() { _ = new(schematest.StandIn).Requests() })
	}},
	{"schematest.New", func(e *env) {
		e.call("New(nil)", func() { _ = schematest.New(nil) })
		tb := &cleanupTB{}
		e.call("New(t)", func() { _ = schematest.New(tb) })
		tb.runCleanups()
	}},
	{"schematest.NewStandInRegistry", func(e *env) {
		e.call("NewStandInRegistry(nil)", func() { _ = schematest.NewStandInRegistry(nil) })
		tb := &cleanupTB{}
		e.call("NewStandInRegistry(t)", func() { _ = schematest.NewStandInRegistry(tb) })
		tb.runCleanups()
	}},
	{"schematest.Registry.External", func(e *env) {
		e.call("(*Registry)(nil).External", func() { _ = (*schematest.Registry)(nil).External() })
		e.call("Registry{}.External", func() { _ = new(schematest.Registry).External() })
	}},
	{"schematest.Registry.Client", func(e *env) {
		e.call("(*Registry)(nil).Client(t)", func() { _ = (*schematest.Registry)(nil).Client(&fakeTB{}) })
		e.call("Registry{}.Client(t)", func() { _ = new(schematest.Registry).Client(&fakeTB{}) })
		e.call("Registry{}.Client(nil)", func() { _ = new(schematest.Registry).Client(nil) })
	}},
	{"schematest.Registry.DownURL", func(e *env) {
		e.call("Registry{}.DownURL(nil)", func() { _ = new(schematest.Registry).DownURL(nil) })
		tb := &cleanupTB{}
		e.call("(*Registry)(nil).DownURL(t)", func() { _ = (*schematest.Registry)(nil).DownURL(tb) })
		tb.runCleanups()
	}},
	{"schematest.Registry.Name", func(e *env) {
		e.call("(*Registry)(nil).Name(t, \"\")", func() { _ = (*schematest.Registry)(nil).Name(&fakeTB{}, "") })
		e.call("Registry{}.Name(nil, \"\")", func() { _ = new(schematest.Registry).Name(nil, "") })
	}},
}

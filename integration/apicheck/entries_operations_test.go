package apicheck_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/adaptive"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// operationsEntries sweep the packages that steer and show the outbox: adaptive, admin, console, deadletter.
var operationsEntries = []entry{
	// ---- package adaptive
	{"adaptive.Tuning.Validate", func(e *env) {
		e.may("Tuning{}.Validate", func() error { return adaptive.Tuning{}.Validate() })
	}},
	{"adaptive.Tuning.WithDefaults", func(e *env) {
		e.call("Tuning{}.WithDefaults", func() { _ = adaptive.Tuning{}.WithDefaults() })
		e.call("Tuning{-1...}.WithDefaults", func() {
			_ = adaptive.Tuning{BatchSize: -1, BackoffBase: -1, BackoffMax: -1, LeaseTTL: -1}.WithDefaults()
		})
	}},
	{"adaptive.Tuning.ProfileName", func(e *env) { e.call("Tuning{}.ProfileName", func() { _ = adaptive.Tuning{}.ProfileName() }) }},
	{"adaptive.Tuning.AppendInterval", func(e *env) {
		e.call("Tuning{}.AppendInterval", func() { _ = adaptive.Tuning{}.AppendInterval() })
	}},
	{"adaptive.Default", func(e *env) { e.call("Default", func() { _ = adaptive.Default() }) }},
	{"adaptive.LowLatency", func(e *env) { e.call("LowLatency", func() { _ = adaptive.LowLatency() }) }},
	{"adaptive.HighThroughput", func(e *env) { e.call("HighThroughput", func() { _ = adaptive.HighThroughput() }) }},
	{"adaptive.Background", func(e *env) { e.call("Background", func() { _ = adaptive.Background() }) }},
	{"adaptive.Profile", func(e *env) {
		e.fails("Profile(\"\")", func() error { _, err := adaptive.Profile(""); return err })
	}},

	// ---- package admin
	{"admin.GroupActiveError.Error", func(e *env) {
		e.call("GroupActiveError{}.Error", func() { _ = new(admin.GroupActiveError).Error() })
	}},
	{"admin.GroupActiveError.Is", func(e *env) {
		e.call("GroupActiveError{}.Is(nil)", func() { _ = new(admin.GroupActiveError).Is(nil) })
	}},
	{"admin.SeqRangeError.Error", func(e *env) {
		e.call("SeqRangeError{}.Error", func() { _ = new(admin.SeqRangeError).Error() })
	}},
	{"admin.SeqRangeError.Is", func(e *env) {
		e.call("SeqRangeError{}.Is(nil)", func() { _ = new(admin.SeqRangeError).Is(nil) })
	}},
	{"admin.Config.Validate", func(e *env) {
		e.fails("admin.Config{}.Validate", func() error { return admin.Config{}.Validate() })
	}},
	{"admin.New", func(e *env) {
		e.fails("admin.New(zero, nil)", func() error { _, err := admin.New(admin.Config{}, nil); return err })
	}},
	{"admin.Admin.Pause", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.Pause(Scope{})", func() error { _, err := a.Pause(e.ctx, admin.Scope{}); return err })
		e.fails("Admin{}.Pause(Scope{Group})", func() error { _, err := new(admin.Admin).Pause(e.ctx, admin.Scope{Group: "g"}); return err })
	}},
	{"admin.Admin.Resume", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.Resume(Scope{})", func() error { _, err := a.Resume(e.ctx, admin.Scope{}); return err })
		e.fails("Admin{}.Resume(Scope{Group})", func() error { _, err := new(admin.Admin).Resume(e.ctx, admin.Scope{Group: "g"}); return err })
	}},
	{"admin.ToSeq", func(e *env) { e.call("ToSeq(0)", func() { _ = admin.ToSeq(0) }) }},
	{"admin.ToTime", func(e *env) { e.call("ToTime(zero)", func() { admin.ToTime(time.Time{}) }) }},
	{"admin.Admin.ResetCursor", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.ResetCursor(Scope{}, Position{})", func() error { _, err := a.ResetCursor(e.ctx, admin.Scope{}, admin.Position{}); return err })
		e.fails("Admin{}.ResetCursor", func() error {
			_, err := new(admin.Admin).ResetCursor(e.ctx, admin.Scope{Group: "g", Topic: "orders"}, admin.ToSeq(0))
			return err
		})
	}},
	{"admin.Admin.DeleteGroup", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.DeleteGroup(\"\", zero)", func() error { _, err := a.DeleteGroup(e.ctx, "", admin.DeleteGroupOptions{}); return err })
		e.fails("Admin{}.DeleteGroup(g)", func() error {
			_, err := new(admin.Admin).DeleteGroup(e.ctx, "g", admin.DeleteGroupOptions{})
			return err
		})
	}},
	{"admin.Admin.RetryHeldNow", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.RetryHeldNow(HeldRef{})", func() error { _, err := a.RetryHeldNow(e.ctx, admin.HeldRef{}); return err })
		e.fails("Admin{}.RetryHeldNow", func() error {
			_, err := new(admin.Admin).RetryHeldNow(e.ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "k"})
			return err
		})
	}},
	{"admin.Admin.DeadLetterHeld", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Admin.DeadLetterHeld(HeldRef{})", func() error { _, err := a.DeadLetterHeld(e.ctx, admin.HeldRef{}); return err })
		e.fails("Admin{}.DeadLetterHeld", func() error {
			_, err := new(admin.Admin).DeadLetterHeld(e.ctx, admin.HeldRef{Group: "g", Topic: "orders", Key: "k"})
			return err
		})
	}},
	{"admin.Admin.HeldHeads", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		var noCtx context.Context
		e.fails("Admin.HeldHeads(nil ctx)", func() error { _, err := a.HeldHeads(noCtx, admin.Filter{}); return err })
		e.fails("Admin{}.HeldHeads", func() error { _, err := new(admin.Admin).HeldHeads(e.ctx, admin.Filter{}); return err })
	}},
	{"admin.Admin.Exists", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Admin.Exists(Filter{})", func() error { return a.Exists(e.ctx, admin.Filter{}) })
		e.fails("Admin{}.Exists(Filter{Group})", func() error { return new(admin.Admin).Exists(e.ctx, admin.Filter{Group: "g"}) })
	}},
	{"admin.NotFoundError.Error", func(e *env) { e.call("NotFoundError{}.Error", func() { _ = new(admin.NotFoundError).Error() }) }},
	{"admin.NotFoundError.Is", func(e *env) { e.call("NotFoundError{}.Is(nil)", func() { _ = new(admin.NotFoundError).Is(nil) }) }},
	{"admin.PartitionStatus.LagAge", func(e *env) {
		e.call("PartitionStatus{}.LagAge", func() { admin.PartitionStatus{}.LagAge() })
	}},
	{"admin.Report.Summary", func(e *env) { e.call("Report{}.Summary", func() { _ = admin.Report{}.Summary() }) }},
	{"admin.Summary.Plus", func(e *env) {
		e.call("Summary{}.Plus(Summary{})", func() { _ = admin.Summary{}.Plus(admin.Summary{}) })
	}},
	{"admin.Admin.Status", func(e *env) {
		a := must(admin.New(admin.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Admin.Status(Filter{})", func() error { _, err := a.Status(e.ctx, admin.Filter{}); return err })
		e.fails("Admin{}.Status", func() error { _, err := new(admin.Admin).Status(e.ctx, admin.Filter{}); return err })
	}},

	// ---- package console
	{"console.Config.Validate", func(e *env) {
		e.fails("console.Config{}.Validate", func() error { return console.Config{}.Validate() })
	}},
	{"console.New", func(e *env) {
		e.fails("console.New(zero, nil)", func() error { _, err := console.New(console.Config{}, nil); return err })
	}},
	{"console.ListenHosts", func(e *env) {
		e.call("ListenHosts(\"\")", func() { _ = console.ListenHosts("") })
		e.call("ListenHosts(\":\")", func() { _ = console.ListenHosts(":") })
	}},
	{"console.Console.ServeHTTP", func(e *env) {
		c := must(console.New(console.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		e.call("Console.ServeHTTP(nil, nil)", func() { c.ServeHTTP(nil, nil) })
		e.call("Console.ServeHTTP(w, nil)", func() { c.ServeHTTP(httptest.NewRecorder(), nil) })
		e.call("Console.ServeHTTP(nil, req)", func() { c.ServeHTTP(nil, req) })
		e.call("Console{}.ServeHTTP(w, req)", func() { new(console.Console).ServeHTTP(httptest.NewRecorder(), req) })
	}},
	{"console.SourcesConfig.Validate", func(e *env) {
		e.fails("console.SourcesConfig{}.Validate", func() error { return console.SourcesConfig{}.Validate() })
		e.fails("SourcesConfig{Sources: [zero]}.Validate", func() error {
			return console.SourcesConfig{Sources: []console.Source{{}}}.Validate()
		})
	}},
	{"console.NewSources", func(e *env) {
		e.fails("console.NewSources(zero, nil)", func() error { _, err := console.NewSources(console.SourcesConfig{}, nil); return err })
		e.fails("console.NewSources([zero], nil)", func() error {
			_, err := console.NewSources(console.SourcesConfig{Sources: []console.Source{{}}}, nil)
			return err
		})
	}},
	{"console.Sources.ServeHTTP", func(e *env) {
		s := must(console.NewSources(console.SourcesConfig{Sources: []console.Source{{Name: "a", Pool: e.pool, Schema: e.schema}}}, nil))(e)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		e.call("Sources.ServeHTTP(nil, nil)", func() { s.ServeHTTP(nil, nil) })
		e.call("Sources.ServeHTTP(w, nil)", func() { s.ServeHTTP(httptest.NewRecorder(), nil) })
		e.call("Sources.ServeHTTP(nil, req)", func() { s.ServeHTTP(nil, req) })
		e.call("Sources{}.ServeHTTP(w, req)", func() { new(console.Sources).ServeHTTP(httptest.NewRecorder(), req) })
	}},

	// ---- package deadletter
	{"deadletter.StateError.Error", func(e *env) { e.call("StateError{}.Error", func() { _ = new(deadletter.StateError).Error() }) }},
	{"deadletter.StateError.Is", func(e *env) { e.call("StateError{}.Is(nil)", func() { _ = new(deadletter.StateError).Is(nil) }) }},
	{"deadletter.Store.List", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.List(zero)", func() error { _, err := s.List(e.ctx, deadletter.ListOptions{}); return err })
		e.fails("Store{}.List", func() error { _, err := new(deadletter.Store).List(e.ctx, deadletter.ListOptions{}); return err })
	}},
	{"deadletter.Store.Count", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Count(zero)", func() error { _, err := s.Count(e.ctx, deadletter.Filter{}); return err })
		e.fails("Store{}.Count", func() error { _, err := new(deadletter.Store).Count(e.ctx, deadletter.Filter{}); return err })
	}},
	{"deadletter.Store.Get", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Get(0)", func() error { _, err := s.Get(e.ctx, 0); return err })
		e.fails("Store{}.Get(1)", func() error { _, err := new(deadletter.Store).Get(e.ctx, 1); return err })
	}},
	{"deadletter.Store.Replay", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Replay(0, zero)", func() error { _, err := s.Replay(e.ctx, 0, deadletter.ReplayOptions{}); return err })
		e.fails("Store{}.Replay(1)", func() error { _, err := new(deadletter.Store).Replay(e.ctx, 1, deadletter.ReplayOptions{}); return err })
	}},
	{"deadletter.Store.Discard", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.Discard(0)", func() error { _, err := s.Discard(e.ctx, 0); return err })
		e.fails("Store{}.Discard(1)", func() error { _, err := new(deadletter.Store).Discard(e.ctx, 1); return err })
	}},
	{"deadletter.Store.Purge", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Purge(zero)", func() error { _, err := s.Purge(e.ctx, deadletter.PurgeOptions{}); return err })
		e.fails("Store{}.Purge", func() error { _, err := new(deadletter.Store).Purge(e.ctx, deadletter.PurgeOptions{}); return err })
	}},
	{"deadletter.Store.PlanPurge", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.PlanPurge(zero)", func() error { _, err := s.PlanPurge(e.ctx, deadletter.PurgeOptions{}); return err })
		e.fails("Store{}.PlanPurge", func() error { _, err := new(deadletter.Store).PlanPurge(e.ctx, deadletter.PurgeOptions{}); return err })
	}},
	{"deadletter.PurgePlan.Deleted", func(e *env) { e.call("PurgePlan{}.Deleted", func() { deadletter.PurgePlan{}.Deleted() }) }},
	{"deadletter.Store.PoisonPublisher", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		pp := s.PoisonPublisher()
		for _, msgs := range nilMsgs {
			e.may(fmt.Sprintf("Store.PoisonPublisher().Publish(orders, %v)", msgs), func() error { return pp.Publish("orders", msgs...) })
		}
		e.call("Store{}.PoisonPublisher().Publish(orders, msg)", func() {
			_ = new(deadletter.Store).PoisonPublisher().Publish("orders", message.NewMessage("u", nil))
		})
	}},
	{"deadletter.Config.Validate", func(e *env) {
		e.fails("deadletter.Config{}.Validate", func() error { return deadletter.Config{}.Validate() })
	}},
	{"deadletter.NewStore", func(e *env) {
		e.fails("NewStore(zero, nil)", func() error { _, err := deadletter.NewStore(deadletter.Config{}, nil); return err })
	}},
	{"deadletter.Store.HandleReject", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.fails("Store.HandleReject(nil tx, zero)", func() error { return s.HandleReject(e.ctx, nil, outboxtype.RejectedMessage{}) })
		e.fails("Store{}.HandleReject(nil tx, zero)", func() error {
			return new(deadletter.Store).HandleReject(e.ctx, nil, outboxtype.RejectedMessage{})
		})
		tx := must(e.pool.Begin(e.ctx))(e)
		defer tx.Rollback(e.ctx)
		e.may("Store.HandleReject(tx, zero)", func() error { return s.HandleReject(e.ctx, tx, outboxtype.RejectedMessage{}) })
	}},
	{"deadletter.Store.Add", func(e *env) {
		s := must(deadletter.NewStore(deadletter.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Store.Add(zero)", func() error { _, err := s.Add(e.ctx, outboxtype.RejectedMessage{}); return err })
		e.fails("Store{}.Add", func() error { _, err := new(deadletter.Store).Add(e.ctx, outboxtype.RejectedMessage{}); return err })
	}},
}

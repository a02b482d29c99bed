package apicheck_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/inbox"
	"github.com/millrace/watermill-outbox/metrics"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/partitioning"
	"github.com/millrace/watermill-outbox/pipeline"
	"github.com/millrace/watermill-outbox/relay"
	"github.com/millrace/watermill-outbox/retention"
)

// consumersEntries sweep inbox, metrics, outboxtest, partitioning, pipeline, relay and retention.
var consumersEntries = []entry{
	// ---- package inbox
	{"inbox.StaleError.Error", func(e *env) { e.call("StaleError{}.Error", func() { _ = new(inbox.StaleError).Error() }) }},
	{"inbox.StaleError.Is", func(e *env) { e.call("StaleError{}.Is(nil)", func() { _ = new(inbox.StaleError).Is(nil) }) }},
	{"inbox.New", func(e *env) {
		e.fails("inbox.New(zero)", func() error { _, err := inbox.New(inbox.Config{}); return err })
	}},
	{"inbox.Migrate", func(e *env) {
		e.fails("inbox.Migrate(nil pool)", func() error { return inbox.Migrate(e.ctx, nil, "") })
	}},
	{"inbox.Inbox.Stats", func(e *env) { e.call("Inbox{}.Stats", func() { new(inbox.Inbox).Stats() }) }},
	{"inbox.Inbox.Process", func(e *env) {
		schema := e.schema + "_inbox"
		if err := inbox.Migrate(e.ctx, e.pool, schema); err != nil {
			e.t.Fatal(err)
		}
		in := must(inbox.New(inbox.Config{Pool: e.pool, Schema: schema, Consumer: "c"}))(e)
		pass := must(inbox.New(inbox.Config{Pool: e.pool, Schema: schema, Consumer: "c", WithoutPosition: inbox.PassThrough}))(e)
		fn := func(context.Context, pgx.Tx) error { return nil }
		msg := message.NewMessage("u", nil)
		for _, c := range []struct {
			name string
			in   *inbox.Inbox
		}{{"Inbox", in}, {"Inbox(PassThrough)", pass}, {"Inbox{}", new(inbox.Inbox)}} {
			name, in := c.name, c.in
			e.fails(name+".Process(nil, nil, nil)", func() error { _, err := in.Process(e.ctx, nil, nil, nil); return err })
			tx := must(e.pool.Begin(e.ctx))(e)
			e.fails(name+".Process(tx, nil, fn)", func() error { _, err := in.Process(e.ctx, tx, nil, fn); return err })
			e.fails(name+".Process(tx, msg, nil)", func() error { _, err := in.Process(e.ctx, tx, msg, nil); return err })
			_ = tx.Rollback(e.ctx)
		}
	}},
	{"inbox.Inbox.Middleware", func(e *env) {
		in := must(inbox.New(inbox.Config{Pool: e.pool, Schema: e.schema + "_inbox", Consumer: "c"}))(e)
		noPool := must(inbox.New(inbox.Config{Consumer: "c"}))(e)
		h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
		for name, in := range map[string]*inbox.Inbox{"Inbox": in, "Inbox(no Pool)": noPool, "Inbox{}": new(inbox.Inbox)} {
			e.fails(name+".Middleware(nil)(msg)", func() error { _, err := in.Middleware(nil)(message.NewMessage("u", nil)); return err })
			e.fails(name+".Middleware(h)(nil)", func() error { _, err := in.Middleware(h)(nil); return err })
		}
	}},

	// ---- package metrics
	{"metrics.NewCollector", func(e *env) {
		e.fails("NewCollector(zero)", func() error { _, err := metrics.NewCollector(metrics.CollectorConfig{}); return err })
	}},
	{"metrics.Collector.Describe", func(e *env) {
		c := must(metrics.NewCollector(metrics.CollectorConfig{Pool: e.pool, Schema: e.schema}))(e)
		e.call("Collector.Describe(nil)", func() { c.Describe(nil) })
		e.call("Collector{}.Describe(ch)", func() {
			ch := make(chan *prometheus.Desc, 1000)
			new(metrics.Collector).Describe(ch)
		})
	}},
	{"metrics.Collector.Collect", func(e *env) {
		c := must(metrics.NewCollector(metrics.CollectorConfig{Pool: e.pool, Schema: e.schema}))(e)
		e.call("Collector.Collect(nil)", func() { c.Collect(nil) })
		e.call("Collector{}.Collect(ch)", func() {
			ch := make(chan prometheus.Metric, 1000)
			new(metrics.Collector).Collect(ch)
		})
	}},
	{"metrics.Config.Validate", func(e *env) {
		e.may("metrics.Config{}.Validate", func() error { return metrics.Config{}.Validate() })
	}},
	{"metrics.Enable", func(e *env) {
		var m *metrics.Metrics
		e.may("metrics.Enable(Registerer: new registry)", func() error {
			var err error
			m, err = metrics.Enable(metrics.Config{Registerer: prometheus.NewRegistry()})
			return err
		})
		if m != nil {
			e.call("Metrics.Disable", func() { m.Disable() })
		}
	}},
	{"metrics.Metrics.Disable", func(e *env) {
		e.call("Metrics{}.Disable", func() { new(metrics.Metrics).Disable() })
	}},

	// ---- package outboxtest
	{"outboxtest.InSchema", func(e *env) { e.call("InSchema(\"\")", func() { outboxtest.InSchema("") }) }},
	{"outboxtest.Key", func(e *env) { e.call("Key(\"\")", func() { outboxtest.Key("") }) }},
	{"outboxtest.UUID", func(e *env) { e.call("UUID(\"\")", func() { outboxtest.UUID("") }) }},
	{"outboxtest.Metadata", func(e *env) { e.call("Metadata(\"\", \"\")", func() { outboxtest.Metadata("", "") }) }},
	{"outboxtest.Payload", func(e *env) { requireWith(e, "Payload(\"\", nil)", outboxtest.Payload("", nil)) }},
	{"outboxtest.PayloadEquals", func(e *env) { requireWith(e, "PayloadEquals(nil)", outboxtest.PayloadEquals(nil)) }},
	{"outboxtest.JSON", func(e *env) { requireWith(e, "JSON(nil)", outboxtest.JSON(nil)) }},
	{"outboxtest.Where", func(e *env) { requireWith(e, "Where(\"\", nil)", outboxtest.Where("", nil)) }},
	{"outboxtest.Times", func(e *env) { requireWith(e, "Times(-1)", outboxtest.Times(-1)) }},
	{"outboxtest.Sequenced", func(e *env) { requireWith(e, "Sequenced()", outboxtest.Sequenced()) }},
	{"outboxtest.RequirePublished", func(e *env) {
		for _, db := range []any{nil, (*pgxpool.Pool)(nil), (*sql.DB)(nil), e.pool} {
			e.call(fmt.Sprintf("RequirePublished(%T, \"\", nil)", db), func() { outboxtest.RequirePublished(&fakeTB{}, db, "", nil) })
		}
	}},
	{"outboxtest.RequirePublishedTx", func(e *env) {
		for _, tx := range []any{nil, pgx.Tx(nil), (*sql.Tx)(nil)} {
			e.call(fmt.Sprintf("RequirePublishedTx(%T, \"\", nil)", tx), func() { outboxtest.RequirePublishedTx(&fakeTB{}, tx, "", nil) })
		}
	}},
	{"outboxtest.RequireNotPublished", func(e *env) {
		for _, db := range []any{nil, (*pgxpool.Pool)(nil), e.pool} {
			e.call(fmt.Sprintf("RequireNotPublished(%T, \"\", nil)", db), func() { outboxtest.RequireNotPublished(&fakeTB{}, db, "", nil) })
		}
	}},
	{"outboxtest.Result.Handled", func(e *env) { e.call("Result{}.Handled", func() { _ = outboxtest.Result{}.Handled() }) }},
	{"outboxtest.NewRunner", func(e *env) {
		e.fails("NewRunner(zero, \"\", nil)", func() error { _, err := outboxtest.NewRunner(e.ctx, outbox.SubscriberConfig{}, "", nil); return err })
		e.fails("NewRunner(zero, orders, h)", func() error {
			_, err := outboxtest.NewRunner(e.ctx, outbox.SubscriberConfig{}, "orders", handler)
			return err
		})
	}},
	{"outboxtest.NewBatchRunner", func(e *env) {
		e.fails("NewBatchRunner(zero, \"\", nil)", func() error {
			_, err := outboxtest.NewBatchRunner(e.ctx, outbox.SubscriberConfig{}, "", nil)
			return err
		})
	}},
	{"outboxtest.Runner.Advance", func(e *env) {
		e.call("Runner{}.Advance(1h)", func() { new(outboxtest.Runner).Advance(time.Hour) })
		e.call("(*Runner)(nil).Advance(-1)", func() { (*outboxtest.Runner)(nil).Advance(-1) })
	}},
	{"outboxtest.Runner.Tick", func(e *env) {
		e.fails("Runner{}.Tick", func() error { _, err := new(outboxtest.Runner).Tick(e.ctx); return err })
	}},
	{"outboxtest.Runner.RunUntilIdle", func(e *env) {
		e.fails("Runner{}.RunUntilIdle", func() error { _, err := new(outboxtest.Runner).RunUntilIdle(e.ctx); return err })
	}},
	{"outboxtest.Runner.Close", func(e *env) {
		e.may("Runner{}.Close", func() error { return new(outboxtest.Runner).Close() })
	}},
	{"outboxtest.RunUntilIdle", func(e *env) {
		e.fails("RunUntilIdle(zero, \"\", nil)", func() error { _, err := outboxtest.RunUntilIdle(e.ctx, outbox.SubscriberConfig{}, "", nil); return err })
		e.fails("RunUntilIdle(cfg, orders, nil)", func() error { _, err := outboxtest.RunUntilIdle(e.ctx, subCfg(e), "orders", nil); return err })
	}},
	{"outboxtest.RunTopicsUntilIdle", func(e *env) {
		e.fails("RunTopicsUntilIdle(cfg, nil)", func() error { _, err := outboxtest.RunTopicsUntilIdle(e.ctx, subCfg(e), nil); return err })
		e.fails("RunTopicsUntilIdle(cfg, {orders: nil})", func() error {
			_, err := outboxtest.RunTopicsUntilIdle(e.ctx, subCfg(e), map[string]outboxtest.Handler{"orders": nil})
			return err
		})
		e.fails("RunTopicsUntilIdle(zero, {\"\": h})", func() error {
			_, err := outboxtest.RunTopicsUntilIdle(e.ctx, outbox.SubscriberConfig{}, map[string]outboxtest.Handler{"": func(*message.Message) error { return nil }})
			return err
		})
	}},
	{"outboxtest.Schema", func(e *env) {
		e.call("Schema(t, nil pool)", func() { outboxtest.Schema(&fakeTB{}, (*pgxpool.Pool)(nil)) })
		e.call("Schema(t, nil *sql.DB)", func() { outboxtest.Schema(&fakeTB{}, (*sql.DB)(nil)) })
	}},

	// ---- package partitioning
	{"partitioning.Murmur2.Partition", func(e *env) {
		e.fails("Murmur2{}.Partition(\"\", 0)", func() error { _, err := partitioning.Murmur2{}.Partition("", 0); return err })
	}},
	{"partitioning.Murmur2Hash", func(e *env) { e.call("Murmur2Hash(nil)", func() { partitioning.Murmur2Hash(nil) }) }},
	{"partitioning.PartitionCountError.Error", func(e *env) {
		e.call("PartitionCountError{}.Error", func() { _ = new(partitioning.PartitionCountError).Error() })
	}},
	{"partitioning.PartitionCountError.Is", func(e *env) {
		e.call("PartitionCountError{}.Is(nil)", func() { _ = new(partitioning.PartitionCountError).Is(nil) })
	}},
	{"partitioning.ValidatePartitions", func(e *env) {
		e.fails("ValidatePartitions(0)", func() error { return partitioning.ValidatePartitions(0) })
	}},
	{"partitioning.PartitionerFunc.Partition", func(e *env) {
		e.fails("PartitionerFunc(nil).Partition(\"\", 1)", func() error { _, err := partitioning.PartitionerFunc(nil).Partition("", 1); return err })
	}},
	{"partitioning.Default", func(e *env) { e.call("Default", func() { partitioning.Default() }) }},

	// ---- package relay
	{"relay.Config.Validate", func(e *env) {
		e.fails("relay.Config{}.Validate", func() error { return relay.Config{}.Validate() })
	}},
	{"relay.DefaultInstance", func(e *env) { e.call("DefaultInstance", func() { relay.DefaultInstance() }) }},
	{"relay.SlotInUseError.Error", func(e *env) { e.call("SlotInUseError{}.Error", func() { _ = new(relay.SlotInUseError).Error() }) }},
	{"relay.SlotInUseError.Is", func(e *env) { e.call("SlotInUseError{}.Is(nil)", func() { _ = new(relay.SlotInUseError).Is(nil) }) }},
	{"relay.Slot", func(e *env) { e.call("Slot(\"\")", func() { _ = relay.Slot("") }) }},
	{"relay.New", func(e *env) {
		e.fails("relay.New(zero, nil)", func() error { _, err := relay.New(relay.Config{}, nil); return err })
	}},
	{"relay.Relay.Stats", func(e *env) { e.call("Relay{}.Stats", func() { new(relay.Relay).Stats() }) }},
	{"relay.Relay.Run", func(e *env) {
		e.fails("Relay{}.Run", func() error { return new(relay.Relay).Run(e.done) })
	}},
	{"relay.Relay.Close", func(e *env) { e.may("Relay{}.Close", func() error { return new(relay.Relay).Close() }) }},
	{"relay.Prerequisites", func(e *env) {
		e.fails("relay.Prerequisites(nil)", func() error { return relay.Prerequisites(e.ctx, nil) })
	}},
	{"relay.CreateSlot", func(e *env) {
		e.fails("relay.CreateSlot(nil, \"\")", func() error { return relay.CreateSlot(e.ctx, nil, "") })
	}},
	{"relay.DropSlot", func(e *env) {
		e.fails("relay.DropSlot(nil, \"\")", func() error { return relay.DropSlot(e.ctx, nil, "", false) })
	}},
	{"relay.StatusOf", func(e *env) {
		e.fails("relay.StatusOf(nil, \"\")", func() error { _, err := relay.StatusOf(e.ctx, nil, ""); return err })
	}},
	{"relay.Relay.Status", func(e *env) {
		r := must(relay.New(relay.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Relay.Status", func() error { _, err := r.Status(e.ctx); return err })
		e.fails("Relay{}.Status", func() error { _, err := new(relay.Relay).Status(e.ctx); return err })
	}},

	// ---- package retention
	{"retention.Config.Validate", func(e *env) {
		e.fails("retention.Config{}.Validate", func() error { return retention.Config{}.Validate() })
	}},
	{"retention.NewVacuum", func(e *env) {
		e.fails("NewVacuum(zero, nil)", func() error { _, err := retention.NewVacuum(retention.Config{}, nil); return err })
	}},
	{"retention.Vacuum.Stats", func(e *env) { e.call("Vacuum{}.Stats", func() { new(retention.Vacuum).Stats() }) }},
	{"retention.Vacuum.Run", func(e *env) {
		v := must(retention.NewVacuum(retention.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Vacuum.Run(ended ctx)", func() error { return v.Run(e.done) })
		e.fails("Vacuum{}.Run", func() error { return new(retention.Vacuum).Run(e.done) })
	}},
	{"retention.Vacuum.Close", func(e *env) { e.may("Vacuum{}.Close", func() error { return new(retention.Vacuum).Close() }) }},
	{"retention.Vacuum.VacuumOnce", func(e *env) {
		e.fails("Vacuum{}.VacuumOnce", func() error { _, err := new(retention.Vacuum).VacuumOnce(e.ctx); return err })
	}},
	{"pipeline.Config.Validate", func(e *env) {
		e.fails("pipeline.Config{}.Validate", func() error { return pipeline.Config{}.Validate() })
		e.fails("pipeline.Config{Pool, Forward: {Topics: [orders]}}.Validate (nil Target)", func() error {
			return pipeline.Config{Pool: e.pool, Schema: e.schema, Forward: forwarder.Config{Topics: []string{"orders"}}}.Validate()
		})
	}},
	{"pipeline.New", func(e *env) {
		e.fails("pipeline.New(zero, nil)", func() error { _, err := pipeline.New(pipeline.Config{}, nil); return err })
	}},
	{"pipeline.Pipeline.Run", func(e *env) {
		p := must(pipeline.New(pipeline.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
		e.may("Pipeline.Run(ended ctx)", func() error { return p.Run(e.done) })
		e.fails("Pipeline.Run(nil ctx)", func() error {
			q := must(pipeline.New(pipeline.Config{Pool: e.pool, Schema: e.schema}, nil))(e)
			var noCtx context.Context
			return q.Run(noCtx)
		})
		e.fails("Pipeline{}.Run", func() error { return new(pipeline.Pipeline).Run(e.done) })
		e.fails("(*Pipeline)(nil).Run", func() error { return (*pipeline.Pipeline)(nil).Run(e.done) })
	}},
	{"pipeline.Pipeline.Close", func(e *env) {
		e.may("Pipeline{}.Close", func() error { return new(pipeline.Pipeline).Close() })
		e.may("(*Pipeline)(nil).Close", func() error { return (*pipeline.Pipeline)(nil).Close() })
	}},
	{"pipeline.Pipeline.Stats", func(e *env) {
		e.call("Pipeline{}.Stats", func() { new(pipeline.Pipeline).Stats() })
		e.call("(*Pipeline)(nil).Stats", func() { (*pipeline.Pipeline)(nil).Stats() })
	}},
	{"pipeline.FleetConfig.Validate", func(e *env) {
		e.may("pipeline.FleetConfig{}.Validate", func() error { return pipeline.FleetConfig{}.Validate() })
		e.fails("pipeline.FleetConfig{Sources: [{}]}.Validate", func() error {
			return pipeline.FleetConfig{Sources: []pipeline.Source{{}}}.Validate()
		})
		e.fails("pipeline.FleetConfig{Sources: [{Name: eu}]}.Validate (nil Pool)", func() error {
			return pipeline.FleetConfig{Sources: []pipeline.Source{{Name: "eu"}}}.Validate()
		})
	}},
	{"pipeline.NewFleet", func(e *env) {
		e.fails("pipeline.NewFleet({Sources: [{Name: eu}]}, nil)", func() error {
			_, err := pipeline.NewFleet(pipeline.FleetConfig{Sources: []pipeline.Source{{Name: "eu"}}}, nil)
			return err
		})
	}},
	{"pipeline.Fleet.Run", func(e *env) {
		f := must(pipeline.NewFleet(pipeline.FleetConfig{}, nil))(e)
		e.may("Fleet.Run(ended ctx)", func() error { return f.Run(e.done) })
		e.fails("Fleet.Run(nil ctx)", func() error {
			g := must(pipeline.NewFleet(pipeline.FleetConfig{}, nil))(e)
			var noCtx context.Context
			return g.Run(noCtx)
		})
		e.fails("Fleet{}.Run", func() error { return new(pipeline.Fleet).Run(e.done) })
		e.fails("(*Fleet)(nil).Run", func() error { return (*pipeline.Fleet)(nil).Run(e.done) })
	}},
	{"pipeline.Fleet.Add", func(e *env) {
		f := must(pipeline.NewFleet(pipeline.FleetConfig{}, nil))(e)
		e.fails("Fleet.Add(zero Source)", func() error { return f.Add(pipeline.Source{}) })
		e.fails("Fleet.Add({Name: eu}) (nil Pool)", func() error { return f.Add(pipeline.Source{Name: "eu"}) })
		e.fails("Fleet{}.Add", func() error { return new(pipeline.Fleet).Add(pipeline.Source{Name: "eu", Pool: e.pool}) })
		e.fails("(*Fleet)(nil).Add", func() error { return (*pipeline.Fleet)(nil).Add(pipeline.Source{}) })
	}},
	{"pipeline.Fleet.Remove", func(e *env) {
		f := must(pipeline.NewFleet(pipeline.FleetConfig{}, nil))(e)
		e.fails("Fleet.Remove(\"\")", func() error { return f.Remove("") })
		e.fails("Fleet{}.Remove", func() error { return new(pipeline.Fleet).Remove("eu") })
		e.fails("(*Fleet)(nil).Remove", func() error { return (*pipeline.Fleet)(nil).Remove("") })
	}},
	{"pipeline.Fleet.Status", func(e *env) {
		e.call("Fleet{}.Status", func() { new(pipeline.Fleet).Status() })
		e.call("(*Fleet)(nil).Status", func() { (*pipeline.Fleet)(nil).Status() })
	}},
	{"pipeline.Fleet.Close", func(e *env) {
		e.may("Fleet{}.Close", func() error { return new(pipeline.Fleet).Close() })
		e.may("(*Fleet)(nil).Close", func() error { return (*pipeline.Fleet)(nil).Close() })
	}},
}

package apicheck_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/retention"

	fixture "github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

// TestUnmigratedSchemaIsErrNotMigrated calls the entry points that read or
// write an outbox schema on one that Migrate never ran on, missing and
// existing but empty: each reports outbox.ErrNotMigrated (a
// *NotMigratedError naming the schema), never PostgreSQL's raw "relation
// does not exist". (inbox.Process, whose schema is the inbox's, is tested
// in package inbox.)
func TestUnmigratedSchemaIsErrNotMigrated(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, exists := range []bool{false, true} {
		name := "missing schema"
		if exists {
			name = "empty schema"
		}
		t.Run(name, func(t *testing.T) {
			ctx := fixture.Ctx(t)
			schema := pgtest.Schema(t)
			if exists {
				if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
					t.Fatal(err)
				}
			}
			e := &env{t: t, ctx: ctx, pool: pool, schema: schema}
			check := func(what string, fn func() error) {
				t.Helper()
				var err error
				e.call(what, func() { err = fn() })
				var nm *outboxtype.NotMigratedError
				if !errors.Is(err, outbox.ErrNotMigrated) || !errors.As(err, &nm) || nm.Schema != schema {
					t.Errorf("%s: %v, want ErrNotMigrated for %q", what, err, schema)
				}
			}
			msg := func() *message.Message { return message.NewMessage("u1", []byte("x")) }
			cfg := outbox.SubscriberConfig{Pool: pool, Schema: schema, ConsumerGroup: "g"}

			check("outbox.RegisterTopic", func() error { return outbox.RegisterTopic(ctx, pool, schema, "orders", 1) })
			check("outbox.TopicPartitions", func() error { _, err := outbox.TopicPartitions(ctx, pool, schema, "orders"); return err })
			check("Publisher.Publish (own transaction)", func() error {
				pub := must(outbox.NewPublisher(outbox.PublisherConfig{Schema: schema, DB: pool, OwnTransaction: true}, nil))(e)
				return pub.Publish("orders", msg())
			})
			check("Publisher.Publish (caller's transaction)", func() error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					pub := must(outbox.NewTxPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil))(e)
					return pub.Publish("orders", msg())
				})
			})
			check("Sequencer.SequenceAll", func() error {
				s := must(outbox.NewSequencer(outbox.SequencerConfig{Pool: pool, Schema: schema}, nil))(e)
				_, err := s.SequenceAll(ctx)
				return err
			})
			check("Subscriber.SubscribeInitialize", func() error {
				s := must(outbox.NewSubscriber(cfg, nil))(e)
				defer s.Close()
				return s.SubscribeInitialize("orders")
			})
			check("Subscriber.Subscribe", func() error {
				s := must(outbox.NewSubscriber(cfg, nil))(e)
				defer s.Close()
				_, err := s.Subscribe(ctx, "orders")
				return err
			})

			a := must(admin.New(admin.Config{Pool: pool, Schema: schema}, nil))(e)
			scope := admin.Scope{Group: "g", Topic: "orders"}
			check("admin.Pause", func() error { _, err := a.Pause(ctx, scope); return err })
			check("admin.Resume", func() error { _, err := a.Resume(ctx, scope); return err })
			check("admin.ResetCursor", func() error { _, err := a.ResetCursor(ctx, scope, admin.ToSeq(0)); return err })
			check("admin.DeleteGroup", func() error { _, err := a.DeleteGroup(ctx, "g", admin.DeleteGroupOptions{}); return err })
			held := admin.HeldRef{Group: "g", Topic: "orders", Key: "k"}
			check("admin.RetryHeldNow", func() error { _, err := a.RetryHeldNow(ctx, held); return err })
			check("admin.DeadLetterHeld", func() error { _, err := a.DeadLetterHeld(ctx, held); return err })
			check("admin.HeldHeads", func() error { _, err := a.HeldHeads(ctx, admin.Filter{}); return err })
			check("admin.Status", func() error { _, err := a.Status(ctx, admin.Filter{}); return err })

			s := must(deadletter.NewStore(deadletter.Config{Pool: pool, Schema: schema}, nil))(e)
			check("deadletter.List", func() error { _, err := s.List(ctx, deadletter.ListOptions{}); return err })
			check("deadletter.Count", func() error { _, err := s.Count(ctx, deadletter.Filter{}); return err })
			check("deadletter.Get", func() error { _, err := s.Get(ctx, 1); return err })
			check("deadletter.Replay", func() error { _, err := s.Replay(ctx, 1, deadletter.ReplayOptions{}); return err })
			check("deadletter.Discard", func() error { _, err := s.Discard(ctx, 1); return err })
			check("deadletter.Purge", func() error { _, err := s.Purge(ctx, deadletter.PurgeOptions{}); return err })
			rejected := outboxtype.RejectedMessage{Group: "g", Topic: "orders", Seq: 1, UUID: "u1", Reason: errors.New("poison")}
			check("deadletter.Add", func() error { _, err := s.Add(ctx, rejected); return err })
			check("deadletter.HandleReject", func() error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return s.HandleReject(ctx, tx, rejected) })
			})

			v := must(retention.NewVacuum(retention.Config{Pool: pool, Schema: schema}, nil))(e)
			check("retention.VacuumOnce", func() error { _, err := v.VacuumOnce(ctx); return err })

			f := must(forwarder.NewForwarder(forwarder.Config{Subscriber: cfg, Topics: []string{"orders"}, Target: sendTarget}, nil))(e)
			check("forwarder.Run", func() error { return f.Run(ctx) })

			check("outboxtest.NewRunner", func() error { _, err := outboxtest.NewRunner(ctx, cfg, "orders", handler); return err })
			check("outboxtest.RunUntilIdle", func() error { _, err := outboxtest.RunUntilIdle(ctx, cfg, "orders", handler); return err })
			tb := &fakeTB{}
			e.call("outboxtest.RequirePublished", func() {
				outboxtest.RequirePublished(tb, pool, "orders", outboxtest.InSchema(schema))
			})
			if !strings.Contains(tb.failed, "is not migrated") {
				t.Errorf("outboxtest.RequirePublished failed with %q, want it to say the schema is not migrated", tb.failed)
			}

			c := must(console.New(console.Config{Pool: pool, Schema: schema}, nil))(e)
			w := httptest.NewRecorder()
			e.call("console GET /", func() {
				c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://localhost/", nil).WithContext(context.Background()))
			})
			if body := w.Body.String(); w.Code < 500 || !strings.Contains(body, "not migrated") {
				t.Errorf("console GET /: %d, %.300q; want a server error that says the schema is not migrated", w.Code, body)
			}
		})
	}
}

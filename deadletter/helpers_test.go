package deadletter_test

import (
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/deadletter"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (see internal/outboxtest) with a dead-letter
// store on it. When the test ends it checks that no goroutine the test
// started is left.
type env struct {
	*outboxtest.Bundle
	store *deadletter.Store
}

func newEnv(t *testing.T) env {
	t.Helper()
	b := outboxtest.Setup(t, outboxtest.NoLeaks())
	store, err := deadletter.NewStore(deadletter.Config{Schema: b.Schema, Pool: b.Pool}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return env{Bundle: b, store: store}
}

func (e env) count(t *testing.T, f deadletter.Filter) int64 {
	t.Helper()
	n, err := e.store.Count(outboxtest.Ctx(t), f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e env) subscriber(t *testing.T, group string, tune func(*outbox.SubscriberConfig)) *outbox.Subscriber {
	t.Helper()
	return e.Subscriber(group, func(c *outbox.SubscriberConfig) {
		c.RejectHandler = e.store
		if tune != nil {
			tune(c)
		}
	})
}

func strategies() []outbox.Strategy { return []outbox.Strategy{outbox.Leased, outbox.Transactional} }

package relay

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgrepl"
	"github.com/millrace/watermill-outbox/internal/relaydriver"
)

// pgBackend is PostgreSQL as a relay's stream uses it
// (internal/relaydriver): a replication connection and an append
// connection with the pool's connection settings.
type pgBackend struct {
	pool *pgxpool.Pool
	q    *dbsql.Queries
}

func (b pgBackend) Stream(ctx context.Context, slot, name string, timeoutMS int64) (relaydriver.Stream, error) {
	replCfg := b.pool.Config().ConnConfig.Config.Copy()
	if replCfg.RuntimeParams == nil {
		replCfg.RuntimeParams = map[string]string{}
	}
	replCfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(timeoutMS, 10)
	conn, err := pgrepl.Connect(ctx, replCfg, name)
	if err != nil {
		return nil, err
	}
	if err := conn.StartLogical(ctx, slot, slot, 0); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

func (b pgBackend) Conn(ctx context.Context, name string, lockTimeoutMS, idleMS int64) (relaydriver.Conn, error) {
	appendCfg := b.pool.Config().ConnConfig.Copy()
	if appendCfg.RuntimeParams == nil {
		appendCfg.RuntimeParams = map[string]string{}
	}
	appendCfg.RuntimeParams["application_name"] = name
	appendCfg.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(idleMS, 10)
	appendCfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(lockTimeoutMS, 10)
	return pgx.ConnectConfig(ctx, appendCfg)
}

func (b pgBackend) EndStaleAppenders(ctx context.Context, name string) (int64, error) {
	var ended int64
	err := b.pool.QueryRow(ctx, b.q.WALEndStaleAppenders, name).Scan(&ended)
	return ended, err
}

// The simulator runs a relay on a model of PostgreSQL through
// relaydriver.Run.
func init() {
	relaydriver.Run = func(cfg any, logger watermill.LoggerAdapter, b relaydriver.Backend, jitter func(time.Duration) time.Duration) (func(ctx context.Context) error, error) {
		c, ok := cfg.(Config)
		if !ok {
			return nil, errors.New("relaydriver.Run: cfg is not a relay.Config")
		}
		c.setDefaults()
		r := &Relay{cfg: c, q: dbsql.For(c.Schema), slot: Slot(c.Schema), prefix: names.WALPrefix(c.Schema), backend: b, jitter: jitter}
		if logger == nil {
			logger = watermill.NopLogger{}
		}
		r.logger = logger.With(watermill.LogFields{"slot": r.slot, "instance": c.Instance})
		return r.run, nil
	}
}

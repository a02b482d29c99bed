package admin

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// DedupKeysCountLimit bounds the count of TopicStatus.DedupKeys: each topic's
// keys are counted by an index scan that stops there, so that a status
// costs the same however many keys a long window holds.
const DedupKeysCountLimit = 10000

// addDedupKeys sets each topic's DedupKeys.
func (a *Admin) addDedupKeys(ctx context.Context, tx pgx.Tx, f Filter, topics []TopicStatus) error {
	if len(topics) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, a.q.DedupKeysStatus, f.Topic, DedupKeysCountLimit)
	if err != nil {
		return err
	}
	counts := map[string]int64{}
	var (
		topic string
		n     int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&topic, &n}, func() error {
		counts[topic] = n
		return nil
	}); err != nil {
		return err
	}
	for i := range topics {
		topics[i].DedupKeys = counts[topics[i].Topic]
	}
	return nil
}

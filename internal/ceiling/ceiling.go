// Package ceiling is the benchmarks' reference point: the plain multi-row
// INSERT an application would write for the same messages, without the
// outbox. bench/ and cmd/outbox-bench measure the outbox against it.
package ceiling

import (
	"context"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/partitioning"
)

// InsertColumns is the statement shape PlainInsert fills: $1 topic, then
// arrays of partitions, keys, uuids, metadata (JSON) and payloads.
const InsertColumns = `(uuid, metadata, payload, partition_key, topic, partition)
	SELECT x.u, x.m::jsonb, x.b, x.k, $1, x.p
	FROM unnest($2::int4[], $3::text[], $4::text[], $5::text[], $6::bytea[]) AS x(p, k, u, m, b)`

// PlainInsert returns a function that turns messages into column arrays as
// an application would (key from metadata, murmur2 partition, JSON
// metadata) and runs insert — "INSERT INTO <table> " + InsertColumns — in
// the given transaction.
func PlainInsert(insert, topic string, partitions int) func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	partitioner := partitioning.Default()
	return func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		parts := make([]int32, len(msgs))
		keys := make([]string, len(msgs))
		uuids := make([]string, len(msgs))
		metas := make([]string, len(msgs))
		payloads := make([][]byte, len(msgs))
		for i, m := range msgs {
			keys[i] = m.Metadata.Get(outbox.PublishPartitionKeyMetadata)
			p, err := partitioner.Partition(keys[i], partitions)
			if err != nil {
				return err
			}
			md, err := json.Marshal(m.Metadata)
			if err != nil {
				return err
			}
			parts[i], uuids[i], metas[i], payloads[i] = int32(p), m.UUID, string(md), m.Payload
		}
		_, err := tx.Exec(ctx, insert, topic, parts, keys, uuids, metas, payloads)
		return err
	}
}

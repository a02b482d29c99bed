package retention

import (
	"context"
	"fmt"
)

// purgeDedupKeys deletes the dedup keys (outbox.DedupKey) whose window is
// over, in chunks of ChunkSize, at most MaxChunksPerVisit of them: a key
// past its window is free for the next publish whether its row is there or
// not, so the rows only take space. more reports that the last chunk was
// full.
func (v *Vacuum) purgeDedupKeys(ctx context.Context) (deleted int64, more bool, err error) {
	for range v.cfg.MaxChunksPerVisit {
		var n int64
		if err := v.cfg.Pool.QueryRow(ctx, v.q.DedupKeysPurgeExpired, v.cfg.ChunkSize).Scan(&n); err != nil {
			return deleted, false, fmt.Errorf("retention: delete expired dedup keys: %w", err)
		}
		deleted += n
		if n < int64(v.cfg.ChunkSize) {
			return deleted, false, nil
		}
	}
	return deleted, true, nil
}

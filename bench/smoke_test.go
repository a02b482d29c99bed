package bench

import (
	"context"
	"fmt"
	"testing"
)

// TestSmoke runs every benchmark body once at a tiny size (no CHECKPOINTs)
// and checks what it wrote, so that `go test ./...` keeps the benchmarks
// working without paying for them.
func TestSmoke(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()

	t.Run("Publish", func(t *testing.T) {
		for _, perTx := range []int{1, 100} {
			n := 3*perTx + 1 // three full transactions and a short one
			if perTx == 1 {
				n = 6
			}
			for _, v := range publishVariants {
				t.Run(fmt.Sprintf("perTx=%d/%s", perTx, v.name), func(t *testing.T) {
					ph, err := runPublish(ctx, e, noTimer{}, v, perTx, n, true)
					if err != nil {
						t.Fatal(err)
					}
					if ph.msgs != n || ph.dur <= 0 || ph.walBytes <= 0 {
						t.Fatalf("implausible phase %+v", ph)
					}
					if e.postmaster != 0 && !ph.serverCPUKnown {
						t.Fatalf("local server (postmaster %d) but no CPU figure", e.postmaster)
					}
				})
			}
		}
	})

	t.Run("SequencerLayout", func(t *testing.T) {
		for _, size := range []int{256, 4096} {
			for _, l := range layouts {
				t.Run(fmt.Sprintf("payload=%d/%s", size, l.name), func(t *testing.T) {
					res, err := runLayout(ctx, e, noTimer{}, l, size, smokeN(size))
					if err != nil {
						t.Fatal(err)
					}
					if res.publish.walBytes <= 0 || res.sequence.walBytes <= 0 {
						t.Fatalf("no WAL measured: %+v", res)
					}
				})
			}
		}
	})

	t.Run("SequenceAll", func(t *testing.T) {
		for _, size := range []int{256, 4096} {
			t.Run(fmt.Sprintf("payload=%d", size), func(t *testing.T) {
				if _, err := runDrain(ctx, e, noTimer{}, size, smokeN(size)); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// smokeN is the message count of a smoke run: with 256 B payloads more than
// one sequencing pass (5000 messages) so that passes follow one another.
func smokeN(size int) int {
	if size == payloadSize {
		return seqBatchSize + 200
	}
	return 250
}

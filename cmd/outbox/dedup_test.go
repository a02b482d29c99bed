package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/termsafe"
)

// outbox status shows a topic's dedup keys (outbox.DedupKey) when it has
// any, with a + at the count's limit; --json has them as dedup_keys.
func TestStatusShowsDedupKeys(t *testing.T) {
	var out bytes.Buffer
	statusTable(termsafe.NewWriter(&out), admin.Report{Topics: []admin.TopicStatus{
		{Topic: "orders", Partitions: 4, DedupKeys: 12},
		{Topic: "clicks", Partitions: 1, DedupKeys: admin.DedupKeysCountLimit},
		{Topic: "plain", Partitions: 1},
	}})
	for _, want := range []string{
		"topic orders: 4 partitions, 0 sequenced, 0 pending, 12 dedup keys\n",
		"topic clicks: 1 partitions, 0 sequenced, 0 pending, 10000+ dedup keys\n",
		"topic plain: 1 partitions, 0 sequenced, 0 pending\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status does not say %q:\n%s", want, out.String())
		}
	}
}

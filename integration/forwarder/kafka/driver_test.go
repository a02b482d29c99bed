package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/watermill-outbox/integration/internal/kafkatest"
	"github.com/millrace/watermill-outbox/internal/kafkadriver"
)

// kgo's EndTransaction(TryCommit) returns nil also when it did not commit:
// when it believes no partition joined the transaction it aborts it (or
// sends nothing) and returns nil (franz-go v1.22, txn.go, "no produce
// succeeded in this transaction but produces were attempted"). The
// product's driver reports a commit only when kgo logged the broker's
// answer to a committing EndTxn; issue 39 lost messages that were counted
// committed on a nil alone.
func TestKgoDriverReportsOnlyCommitsTheBrokerAnswered(t *testing.T) {
	c, fake := kafkatest.NewFake(t, "the produce failures that make kgo turn a commit into an abort are injected")
	topic := c.Topic(t, "driver", 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := kafkadriver.NewKgo(func(extra []kgo.Opt) []kgo.Opt {
		return append([]kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.RecordRetries(1)}, extra...)
	}, func(id string) []kgo.Opt { return []kgo.Opt{kgo.TransactionalID(id)} })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	record := func() *kgo.Record { return &kgo.Record{Topic: topic, Value: []byte("x")} }

	for _, tc := range []struct {
		name      string
		fault     *kerr.Error // the produce fails with it (nil: succeeds)
		commit    bool
		committed bool
	}{
		{"a commit the broker answered", nil, true, true},
		{"an abort", nil, false, false},
		// kgo sends EndTxn{Commit: false} and returns nil.
		{"a commit kgo turns into an abort", kerr.InvalidRecord, true, false},
		// kgo fails its producer id and returns nil without any EndTxn.
		{"a commit kgo drops", kerr.UnknownProducerID, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := d.Transactional("driver-" + topic + "-" + tc.name)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if err := p.Init(ctx); err != nil {
				t.Fatal(err)
			}
			if err := p.Begin(); err != nil {
				t.Fatal(err)
			}
			if tc.fault != nil {
				fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: tc.fault})
			}
			errs, finished := p.Produce(ctx, []*kgo.Record{record()})
			if !finished || (errs[0] != nil) != (tc.fault != nil) {
				t.Fatalf("produce: finished %v, %v", finished, errs[0])
			}
			committed, err := p.End(ctx, tc.commit)
			if err != nil {
				t.Fatalf("End(%v) = %v (kgo returned an error: the case this test stands for did not happen)", tc.commit, err)
			}
			if committed != tc.committed {
				t.Fatalf("End(%v) reported committed %v, want %v", tc.commit, committed, tc.committed)
			}
		})
	}
}

package outbox_test

import (
	"errors"
	"sync"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestRegisterTopicCreatesPartitionsAndRefusesAnotherCount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 16)
	e.Register("orders", 16) // same count: fine, nothing changes
	if n := e.Rows("partitions"); n != 16 {
		t.Fatalf("%d partition rows, want 16", n)
	}
	err := outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "orders", 8)
	var pm *outboxtype.PartitionMismatchError
	if !errors.Is(err, outbox.ErrPartitionMismatch) || !errors.As(err, &pm) || pm.Registered != 16 || pm.Requested != 8 {
		t.Fatalf("err = %v", err)
	}
	if n, err := outbox.TopicPartitions(outboxtest.Ctx(t), e.Pool, e.Schema, "orders"); err != nil || n != 16 {
		t.Fatalf("partitions = %d, %v", n, err)
	}
	if n := e.Rows("partitions"); n != 16 {
		t.Fatalf("mismatch changed partitions: %d rows", n)
	}
	if _, err := outbox.TopicPartitions(outboxtest.Ctx(t), e.Pool, e.Schema, "nope"); !errors.Is(err, outbox.ErrUnknownTopic) {
		t.Fatalf("unknown topic: %v", err)
	}
}

func TestRegisterTopicConcurrently(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = outbox.RegisterTopic(outboxtest.Ctx(t), e.Pool, e.Schema, "race", 32)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.Rows("partitions"); n != 32 {
		t.Fatalf("%d partition rows, want 32", n)
	}
}

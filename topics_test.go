package outbox_test

import (
	"errors"
	"sync"
	"testing"

	outbox "github.com/millrace/watermill-outbox"
)

func TestRegisterTopicCreatesPartitionsAndRefusesAnotherCount(t *testing.T) {
	e := newEnv(t)
	e.register(t, "orders", 16)
	e.register(t, "orders", 16) // same count: fine, nothing changes
	if n := e.count(t, "partitions"); n != 16 {
		t.Fatalf("%d partition rows, want 16", n)
	}
	err := outbox.RegisterTopic(ctx(t), e.pool, e.schema, "orders", 8)
	var pm *outbox.PartitionMismatchError
	if !errors.Is(err, outbox.ErrPartitionMismatch) || !errors.As(err, &pm) || pm.Registered != 16 || pm.Requested != 8 {
		t.Fatalf("err = %v", err)
	}
	if n, err := outbox.TopicPartitions(ctx(t), e.pool, e.schema, "orders"); err != nil || n != 16 {
		t.Fatalf("partitions = %d, %v", n, err)
	}
	if n := e.count(t, "partitions"); n != 16 {
		t.Fatalf("mismatch changed partitions: %d rows", n)
	}
	if _, err := outbox.TopicPartitions(ctx(t), e.pool, e.schema, "nope"); !errors.Is(err, outbox.ErrUnknownTopic) {
		t.Fatalf("unknown topic: %v", err)
	}
}

func TestRegisterTopicConcurrently(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = outbox.RegisterTopic(ctx(t), e.pool, e.schema, "race", 32)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.count(t, "partitions"); n != 32 {
		t.Fatalf("%d partition rows, want 32", n)
	}
}

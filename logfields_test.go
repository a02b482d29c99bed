package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/internal/outboxtest"
)

// Every log line about a delivery carries structured fields an operator
// (or log/slog) can filter on: component, group, topic, partition, seq.
func TestDeliveryLogLinesCarryGroupTopicPartitionAndSeq(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.Register("orders", 1)
	e.Publish("orders", message.NewMessage("poison", []byte("x")))
	e.SequenceAll()
	logger := watermill.NewCaptureLogger()
	sub, err := outbox.NewSubscriber(outbox.SubscriberConfig{
		Schema: e.Schema, Pool: e.Pool, ConsumerGroup: "billing", Tuning: outboxtest.FastTuning(), Advanced: outboxtest.FastAdvanced(), CloseTimeout: time.Second,
		DisableSequencer: true, HandlerTimeout: 200 * time.Millisecond,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(outboxtest.Ctx(t), "orders")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		first := true
		for m := range msgs {
			if first { // no answer: the delivery times out
				first = false
				continue
			}
			m.Ack()
		}
	}()
	var line *watermill.CapturedMessage
	outboxtest.WaitFor(t, "the timeout log line", 30*time.Second, func() bool {
		for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
			if m.Msg == "Handler timed out: the delivery counts as a failed attempt" {
				line = &m
				return true
			}
		}
		return false
	})
	want := map[string]any{"component": "outbox.subscriber", "group": "billing", "topic": "orders", "partition": 0, "seq": int64(1)}
	for k, v := range want {
		if line.Fields[k] != v {
			t.Errorf("field %s = %#v, want %#v (all: %v)", k, line.Fields[k], v, line.Fields)
		}
	}
	if !errors.Is(line.Err, outbox.ErrHandlerTimeout) {
		t.Errorf("logged error %v does not match ErrHandlerTimeout", line.Err)
	}
}

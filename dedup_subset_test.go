package outbox

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// encodedBatch.subset carries every column encode fills: a column added to
// the batch and forgotten there would reach the publish statement with the
// wrong length (or be lost) for calls with repeated dedup keys.
func TestEncodedBatchSubsetCarriesEveryColumn(t *testing.T) {
	t.Parallel()
	p, err := newPublisher(nil, PublisherConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*message.Message{message.NewMessage("a", []byte("1")), message.NewMessage("b", nil), message.NewMessage("c", []byte("3"))}
	b, err := p.encode("orders", &topicState{partitions: 2}, msgs)
	if err != nil {
		t.Fatal(err)
	}
	whole, sub := reflect.ValueOf(b), reflect.ValueOf(b.subset([]int{2, 0}))
	for i := range sub.NumField() {
		name := sub.Type().Field(i).Name
		switch f := sub.Field(i); f.Kind() {
		case reflect.Slice:
			if f.Len() != 2 || whole.Field(i).Len() != 3 {
				t.Errorf("%s: %d of 3 in the batch, %d in a subset of 2", name, whole.Field(i).Len(), f.Len())
			} else if fmt.Sprint(f.Index(0)) != fmt.Sprint(whole.Field(i).Index(2)) {
				t.Errorf("%s: the subset's first is not the batch's third", name)
			}
		default:
			if fmt.Sprint(f) != fmt.Sprint(whole.Field(i)) {
				t.Errorf("%s: not carried over", name)
			}
		}
	}
}

package walrecord

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTripAndEveryTruncationIsAnError(t *testing.T) {
	payload := []byte{0, 1, 2, 255}
	rec := Append(nil, 1023, "orders", "key-é", "uuid-1", `{"a":"b"}`, payload)
	if len(rec) > Size("orders", "key-é", "uuid-1", `{"a":"b"}`, payload) {
		t.Fatalf("record of %d bytes is longer than Size", len(rec))
	}
	m, err := Decode(rec)
	if err != nil {
		t.Fatal(err)
	}
	if m.Partition != 1023 || m.Topic != "orders" || m.Key != "key-é" || m.UUID != "uuid-1" || m.Metadata != `{"a":"b"}` || !bytes.Equal(m.Payload, payload) {
		t.Fatalf("decoded %+v", m)
	}
	// Cut anywhere inside the header: a corrupt record, never a panic.
	header := len(rec) - len(payload)
	for i := 0; i < header; i++ {
		if _, err := Decode(rec[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("record cut at %d: %v, want ErrCorrupt", i, err)
		}
	}
	empty, err := Decode(Append(nil, 0, "t", "", "u", "{}", nil))
	if err != nil || len(empty.Payload) != 0 || empty.Key != "" {
		t.Fatalf("empty payload and key: %+v, %v", empty, err)
	}
}

func TestAnUnknownVersionIsRefused(t *testing.T) {
	rec := Append(nil, 0, "t", "", "u", "{}", nil)
	rec[0] = Version + 1
	if _, err := Decode(rec); !errors.Is(err, ErrVersion) {
		t.Fatalf("got %v, want ErrVersion", err)
	}
}

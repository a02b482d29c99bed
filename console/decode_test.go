package console

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// fixedDecoder answers every payload with its fields.
type fixedDecoder struct {
	text []byte
	id   int
	ok   bool
	err  error
}

func (d fixedDecoder) JSON(context.Context, []byte) ([]byte, int, bool, error) {
	return d.text, d.id, d.ok, d.err
}

// A decoded payload's JSON is cut as a payload is (its first 16 KiB);
// a payload not in the wire format shows no JSON; an error is shown with
// the schema id.
func TestDecodedPayloadIsCutLikeAPayload(t *testing.T) {
	long := []byte(`{"a":"` + strings.Repeat("x", 40<<10) + `"}`)
	c := &Console{cfg: Config{Payloads: fixedDecoder{text: long, id: 7, ok: true}}}
	v := c.decode(context.Background(), []byte{0, 0, 0, 0, 7, 1})
	if v == nil || v.ID != 7 || !v.JSON.Cut || len(v.JSON.Text) > payloadPreviewBytes || v.JSON.Shown != "16.0 KiB" || v.Error != "" {
		t.Fatalf("a long JSON rendering: %+v", v)
	}
	if v := (&Console{cfg: Config{Payloads: fixedDecoder{}}}).decode(context.Background(), []byte("plain")); v != nil {
		t.Errorf("a payload not in the wire format: %+v, want no JSON", v)
	}
	if v := (&Console{}).decode(context.Background(), []byte("plain")); v != nil {
		t.Errorf("without Config.Payloads: %+v", v)
	}
	v = (&Console{cfg: Config{Payloads: fixedDecoder{id: 9, err: errors.New("registry down")}}}).decode(context.Background(), []byte{0, 0, 0, 0, 9})
	if v == nil || v.Error != "the payload could not be decoded with its schema (schema id 9): registry down" {
		t.Errorf("a failed decoding: %+v", v)
	}
}

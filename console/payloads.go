package console

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"

	"github.com/millrace/watermill-outbox/deadletter"
)

// PayloadDecoder renders a payload in a schema registry's wire format
// (magic byte 0, 4-byte schema id, the record) as JSON text, decoded with
// the schema of its id: *schema.Codec implements it (a Codec made with
// schema.New and no Schemas only decodes). JSON returns ok false and a nil
// error for a payload that is not in the wire format; an error when the
// schema cannot be had (the registry unreachable, an unknown id) or the
// record does not decode with it.
//
// The console takes the interface, not the Codec, so that an application
// that mounts the console links no Avro or Protobuf library unless it
// uses them.
type PayloadDecoder interface {
	JSON(ctx context.Context, payload []byte) (text []byte, id int, ok bool, err error)
}

// decodedView is what the dead-letter page shows of a payload decoded
// with its schema, beside the raw bytes.
type decodedView struct {
	// ID is the schema id of the payload's header.
	ID int
	// JSON is the record as JSON, cut as a payload is; Error the reason
	// it could not be decoded ("" when it was).
	JSON  payloadView
	Error string
}

// entryView is the dead-letter page's data: the entry and its decoded
// payload (nil without Config.Payloads, or for a payload not in the wire
// format).
type entryView struct {
	deadletter.Entry
	Decoded *decodedView
}

// decode renders p with Config.Payloads, when set. A failure is shown on
// the page, never fails it.
func (c *Console) decode(ctx context.Context, p []byte) *decodedView {
	if c.cfg.Payloads == nil || len(p) == 0 {
		return nil
	}
	text, id, ok, err := c.cfg.Payloads.JSON(ctx, p)
	switch {
	case err != nil:
		what := "the payload could not be decoded with its schema"
		if id > 0 {
			what += " (schema id " + strconv.Itoa(id) + ")"
		}
		return &decodedView{ID: id, Error: what + ": " + err.Error()}
	case !ok:
		return nil
	}
	var indented bytes.Buffer
	if json.Indent(&indented, text, "", "  ") == nil {
		text = indented.Bytes()
	}
	return &decodedView{ID: id, JSON: viewPayload(text)}
}

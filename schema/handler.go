package schema

import (
	"errors"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"
	"google.golang.org/protobuf/proto"

	outbox "github.com/millrace/watermill-outbox"
)

var protoMessageType = reflect.TypeFor[proto.Message]()

// Handler returns a Watermill handler that decodes each delivered message
// into a T (with Codec.Decode) and calls fn with it: T is the Go type of
// the topic's records (a struct with `avro` or `json` tags, or a generated
// protobuf type such as *shoppb.Order). A record that cannot be decoded
// into a T is permanent: it is rejected (outbox.Reject, to the
// Subscriber's dead letters) instead of retried for ever; a registry that
// cannot be reached for an id not seen before returns its error, and the
// delivery is retried. Add outbox.QuietRejects to the Router so that the
// rejections are not logged as failed handlers.
//
// With a nil c or fn, the handler returns an error matching
// outbox.ErrInvalidArgument for every message.
func Handler[T any](c *Codec, fn func(msg *message.Message, v T) error) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		switch {
		case c == nil || c.byID == nil:
			return errNotConstructed()
		case fn == nil:
			return errNilHandler()
		case msg == nil:
			return errNilMessage()
		}
		var v T
		var target any = &v
		if rt := reflect.TypeFor[T](); rt.Kind() == reflect.Pointer && rt.Implements(protoMessageType) {
			v = reflect.New(rt.Elem()).Interface().(T)
			target = v
		}
		if err := c.Decode(msg, target); err != nil {
			if errors.Is(err, ErrRegistryUnavailable) {
				return err
			}
			return outbox.Reject(msg, err)
		}
		return fn(msg, v)
	}
}

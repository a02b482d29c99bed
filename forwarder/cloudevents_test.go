package forwarder_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func TestCloudEventsValidate(t *testing.T) {
	typ := func(*message.Message) string { return "t" }
	for name, tc := range map[string]struct {
		cfg   forwarder.CloudEvents
		field string // "" valid
	}{
		"off":                                     {forwarder.CloudEvents{}, ""},
		"binary":                                  {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop/orders"}, ""},
		"structured, all set":                     {forwarder.CloudEvents{Mode: forwarder.CloudEventsStructured, Source: "urn:shop:orders", Type: typ, TimeMetadata: "at", DataContentType: "application/json; charset=utf-8"}, ""},
		"fields without a mode":                   {forwarder.CloudEvents{Source: "/shop"}, "CloudEvents.Mode"},
		"no such mode":                            {forwarder.CloudEvents{Mode: 7, Source: "/shop"}, "CloudEvents.Mode"},
		"no source":                               {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary}, "CloudEvents.Source"},
		"a source with a space":                   {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/shop orders"}, "CloudEvents.Source"},
		"a source that is no URI":                 {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "http://[::1"}, "CloudEvents.Source"},
		"Type and TypeMetadata":                   {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", Type: typ, TypeMetadata: "kind"}, "CloudEvents.TypeMetadata"},
		"a metadata key with a space":             {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TimeMetadata: "a b"}, "CloudEvents.TimeMetadata"},
		"TypeMetadata is the id header":           {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TypeMetadata: "ce_id"}, "CloudEvents.TypeMetadata"},
		"TypeMetadata is the content type":        {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TypeMetadata: "Content-Type"}, "CloudEvents.TypeMetadata"},
		"TimeMetadata is NATS's source header":    {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TimeMetadata: "ce-source"}, "CloudEvents.TimeMetadata"},
		"TimeMetadata is the type header":         {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TimeMetadata: "ce_type"}, "CloudEvents.TimeMetadata"},
		"the binding's own type and time headers": {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TypeMetadata: "ce-type", TimeMetadata: "CE_TIME"}, ""},
		"TypeMetadata is the dataschema header":   {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TypeMetadata: forwarder.DataSchemaMetadata}, "CloudEvents.TypeMetadata"},
		"TimeMetadata is the content type header": {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", TimeMetadata: forwarder.DataContentTypeMetadata}, "CloudEvents.TimeMetadata"},
		"no media type":                           {forwarder.CloudEvents{Mode: forwarder.CloudEventsBinary, Source: "/s", DataContentType: "json"}, "CloudEvents.DataContentType"},
	} {
		err := tc.cfg.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		var ce *outboxtype.ConfigError
		if !errors.Is(err, outbox.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a *ConfigError on %s", name, err, tc.field)
		}
	}
}

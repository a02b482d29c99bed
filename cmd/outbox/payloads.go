package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/schema"
)

// Payloads in a schema registry's wire format (magic byte 0, 4-byte schema
// id, the record: what a schema.Codec's Publisher writes) are shown decoded
// as JSON beside their raw bytes when a registry is named: --schema-registry
// URL on dlq show, held list and serve, or schema_registry in the --config
// file (the flag wins).

// schemaRegistryFlag adds --schema-registry to cmd.
func (a *app) schemaRegistryFlag(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&a.schemaRegistry, "schema-registry", "", "schema registry URL (default the --config file's schema_registry): "+what)
}

// registryURL is the schema registry the run decodes with ("" for none):
// --schema-registry, or the --config file's schema_registry.
func (a *app) registryURL() (string, error) {
	u, from := a.schemaRegistry, "--schema-registry"
	if u == "" {
		u, from = a.file.SchemaRegistry, "--config "+a.configPath+": schema_registry"
	}
	if u == "" {
		return "", nil
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return "", usagef("%s %q is not the URL of a schema registry (http://registry:8081)", from, u)
	}
	return u, nil
}

// payloadDecoder is a schema.Codec that decodes with the run's schema
// registry, nil when none is named. It asks the registry nothing until a
// payload in the wire format is decoded.
func (a *app) payloadDecoder(ctx context.Context) (*schema.Codec, error) {
	u, err := a.registryURL()
	if err != nil || u == "" {
		return nil, err
	}
	cl, err := sr.NewClient(sr.URLs(u))
	if err != nil {
		return nil, usagef("--schema-registry %q: %v", u, err)
	}
	return schema.New(ctx, schema.Config{Client: cl}, nil)
}

// decodedPayload is a payload decoded with its schema, for -o json: the
// record as JSON, or why it could not be decoded.
type decodedPayload struct {
	JSON     json.RawMessage `json:"payload_json,omitempty"`
	SchemaID int             `json:"payload_schema_id,omitempty"`
	Error    string          `json:"payload_json_error,omitempty"`
}

// decodePayload decodes p with codec (nil: no registry named). ok is
// false for a payload not in the wire format, or without a registry.
func decodePayload(ctx context.Context, codec *schema.Codec, p []byte) (d decodedPayload, ok bool) {
	if codec == nil || len(p) == 0 {
		return d, false
	}
	text, id, ok, err := codec.JSON(ctx, p)
	switch {
	case err != nil:
		return decodedPayload{SchemaID: id, Error: err.Error()}, true
	case !ok:
		return d, false
	}
	return decodedPayload{JSON: text, SchemaID: id}, true
}

// printPayload prints a payload on a line "payload", quoted and cut at
// payloadPreviewBytes, and, when it was decoded, its JSON (quoted and cut
// the same) or why it could not be, on a line "payload (json, schema id N)".
func printPayload(w *termsafe.Writer, p []byte, d *decodedPayload) {
	if utf8.Valid(p) {
		head, cut := payloadPreview(p)
		if cut {
			w.Printf("payload\t%s… (the first %d of %d bytes: -o json has it whole)\n", strconv.Quote(head), len(head), len(p))
		} else {
			w.Printf("payload\t%s\n", strconv.Quote(head))
		}
	} else {
		w.Printf("payload\t%d bytes, not UTF-8: use -o json\n", len(p))
	}
	if d == nil {
		return
	}
	label := "payload (json)"
	if d.SchemaID > 0 {
		label = fmt.Sprintf("payload (json, schema id %d)", d.SchemaID)
	}
	if d.Error != "" {
		w.Printf("%s\tNOT DECODED: %s\n", label, d.Error)
		return
	}
	head, cut := payloadPreview(d.JSON)
	if cut {
		w.Printf("%s\t%s… (the first %d of %d bytes: -o json has it whole)\n", label, strconv.Quote(head), len(head), len(d.JSON))
	} else {
		w.Printf("%s\t%s\n", label, strconv.Quote(head))
	}
}

// undecoded is the error a command returns, after its output, when n of
// its payloads could not be decoded (the first's reason, first): the
// output says which; scripts see a non-zero exit, as for a source that
// could not be read.
func undecoded(n, of int, first string) error {
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d payloads in the wire format could not be decoded with the schema registry (shown above): %s", n, of, first)
}

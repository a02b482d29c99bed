package schema_test

import (
	"testing"

	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/schema"
)

// The Publisher's CloudEvents metadata are the keys the forwarder's
// CloudEvents read as the dataschema and datacontenttype attributes
// (schema does not import forwarder: the keys are written twice).
func TestCloudEventsMetadataKeysAreTheForwarders(t *testing.T) {
	if schema.MetadataCloudEventsDataSchema != forwarder.DataSchemaMetadata {
		t.Errorf("schema.MetadataCloudEventsDataSchema %q, forwarder.DataSchemaMetadata %q", schema.MetadataCloudEventsDataSchema, forwarder.DataSchemaMetadata)
	}
	if schema.MetadataCloudEventsContentType != forwarder.DataContentTypeMetadata {
		t.Errorf("schema.MetadataCloudEventsContentType %q, forwarder.DataContentTypeMetadata %q", schema.MetadataCloudEventsContentType, forwarder.DataContentTypeMetadata)
	}
}

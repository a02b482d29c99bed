// Package schematest is a stand-in for a Confluent-compatible Schema
// Registry, for tests of code that registers, looks up and evolves Avro,
// Protobuf and JSON Schema schemas, where no real registry runs.
//
// A StandIn serves, on a loopback port of its own, the REST subset that
// franz-go's sr.Client uses: subjects and their versions, schemas by id,
// lookup, soft and permanent deletes, global and per-subject compatibility
// levels, and compatibility checks. Unlike franz-go's srfake, it really
// checks compatibility, at registration (HTTP 409, error code 409, with
// Confluent's "Schema being registered is incompatible with an earlier
// schema" message naming the field and what broke) and on the
// compatibility endpoints (?verbose=true gives the messages), for every
// level from NONE to FULL_TRANSITIVE:
//
//   - Avro: hamba/avro's schema resolution, field by field;
//   - Protobuf: removed messages and field numbers whose wire type changed
//     (see compat_protobuf.go for the rules);
//   - JSON Schema: changed property types and newly required properties
//     (see compat_json.go).
//
// Schema text a parser refuses is HTTP 422 with error code 42201 and the
// parser's message. The same schema registered again under a subject
// keeps its id, and the same schema under two subjects shares one id, as
// in Confluent's registry. Down and Up make the registry go away and come
// back on the same URL with the same state; Requests counts the requests
// served.
//
// New gives a test its registry: a stand-in, or, when the environment
// variable OUTBOX_TEST_SCHEMA_REGISTRY_URL is set, that real registry, so
// that the same tests run against both. Name gives subjects (and topics)
// that do not collide on a shared registry.
package schematest

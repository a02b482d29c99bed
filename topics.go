package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/schemacheck"
	"github.com/millrace/watermill-outbox/outboxtype"
	"github.com/millrace/watermill-outbox/partitioning"
)

// DefaultSchema is the PostgreSQL schema the outbox uses unless configured
// otherwise.
const DefaultSchema = names.DefaultSchema

// RegisterTopic makes sure topic exists in schema with the given partition
// count, creating it and its partitions when missing. db is a
// *pgxpool.Pool, *pgx.Conn or *sql.DB. Asking for another count than the
// registered one fails with a *outboxtype.PartitionMismatchError and changes nothing:
// partition counts are fixed, because a key's partition must not move.
// Options: ForwardOnly.
func RegisterTopic[D DB](ctx context.Context, db D, schema, topic string, partitions int, opts ...TopicOption) error {
	return registerTopicOn(ctx, any(db), schema, topic, partitions, opts...)
}

// TopicOption is an option of RegisterTopic.
type TopicOption struct {
	forwardOnly bool
}

// ForwardOnly registers a topic that one Forwarder reads and no
// Subscriber does. Its messages take the short path: the forwarder reads
// them from pending, where a Publisher in ModeTable wrote them (in
// ModeWAL, the relay puts them there, in commit order), and removes them
// in the transaction that records them forwarded, so they are never
// copied into the log (the sequencer leaves them alone). A Subscriber refuses such a topic
// (ErrForwardOnly). The Forwarder's Target must support it (the Kafka
// target does, exactly once). Fixed at registration, like the partition
// count: registering the topic again without it (or an existing topic with
// it) fails with an *outboxtype.ConfigError. docs/forwarder.md, "Forwarder-only
// topics", says which path a topic takes and how an operator sees it.
func ForwardOnly() TopicOption { return TopicOption{forwardOnly: true} }

func registerTopicOn(ctx context.Context, db any, schema, topic string, partitions int, opts ...TopicOption) error {
	var o TopicOption
	for _, opt := range opts {
		o.forwardOnly = o.forwardOnly || opt.forwardOnly
	}
	if schema == "" {
		schema = DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return err
	}
	if err := names.Topic(topic); err != nil {
		return err
	}
	if err := partitioning.ValidatePartitions(partitions); err != nil {
		return err
	}
	d, err := pgexec.FromDB(db)
	if err != nil {
		return err
	}
	if err := schemacheck.Check(ctx, checkKey(db, d), d, schema); err != nil {
		return err
	}
	_, err = registerTopic(ctx, d, schema, topic, partitions, o.forwardOnly)
	return schemacheck.Wrap(err, schema)
}

// TopicPartitions reports the partition count of a registered topic, or an
// error matching ErrUnknownTopic.
func TopicPartitions[D DB](ctx context.Context, db D, schema, topic string) (int, error) {
	return topicPartitions(ctx, any(db), schema, topic)
}

func topicPartitions(ctx context.Context, db any, schema, topic string) (int, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := names.Schema(schema); err != nil {
		return 0, err
	}
	if err := names.Topic(topic); err != nil {
		return 0, err
	}
	d, err := pgexec.FromDB(db)
	if err != nil {
		return 0, err
	}
	if err := schemacheck.Check(ctx, checkKey(db, d), d, schema); err != nil {
		return 0, err
	}
	n, err := lookupTopic(ctx, d, schema, topic)
	return n, schemacheck.Wrap(err, schema)
}

// checkKey is the key the schema check of db is cached under: the database
// for a *pgx.Conn (so short-lived connections do not pile up in the
// cache), the handle itself otherwise.
func checkKey(db any, d pgexec.DB) any {
	if id := pgexec.Identity(d); id != nil {
		return id
	}
	return db
}

// pathName says how a topic was registered, for errors.
func pathName(forwardOnly bool) string {
	if forwardOnly {
		return "forwarder-only (outbox.ForwardOnly)"
	}
	return "without outbox.ForwardOnly (its messages go through the log)"
}

// lookupTopicPath returns the partition count of a registered topic and
// whether it is forwarder-only, or an error matching ErrUnknownTopic.
func lookupTopicPath(ctx context.Context, q pgexec.Querier, schema, topic string) (int, bool, error) {
	var n int
	var forwardOnly bool
	err := pgexec.QueryRow(ctx, q, dbsql.For(schema).TopicsForwardOnly, []any{topic}, &n, &forwardOnly)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, fmt.Errorf("%w: %q in schema %q: register it with outbox.RegisterTopic(ctx, db, %q, %q, partitions) (or: outbox topics register %s N) before it is used", ErrUnknownTopic, topic, schema, schema, topic, topic)
	}
	if err != nil {
		return 0, false, fmt.Errorf("outbox: look up topic %q: %w", topic, err)
	}
	return n, forwardOnly, nil
}

func lookupTopic(ctx context.Context, q pgexec.Querier, schema, topic string) (int, error) {
	var n int
	err := pgexec.QueryRow(ctx, q, dbsql.For(schema).TopicsPartitions, []any{topic}, &n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: %q in schema %q: register it with outbox.RegisterTopic(ctx, db, %q, %q, partitions) (or: outbox topics register %s N) before it is used", ErrUnknownTopic, topic, schema, schema, topic, topic)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: look up topic %q: %w", topic, err)
	}
	return n, nil
}

// registerTopic inserts the topic with its partition rows in one statement,
// or reads the existing count. When another instance registers the same
// topic at the same moment, the insert waits for it and finds the row; the
// statement's snapshot cannot see that row yet, so it is read again.
func registerTopic(ctx context.Context, q pgexec.Querier, schema, topic string, partitions int, forwardOnly bool) (int, error) {
	stmt := dbsql.For(schema).TopicsRegister
	for attempt := 0; attempt < 3; attempt++ {
		var got int
		err := pgexec.QueryRow(ctx, q, stmt, []any{topic, partitions, forwardOnly}, &got)
		if err == nil {
			return got, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, fmt.Errorf("outbox: register topic %q: %w", topic, err)
		}
		var registeredForwardOnly bool
		got, registeredForwardOnly, err = lookupTopicPath(ctx, q, schema, topic)
		if errors.Is(err, ErrUnknownTopic) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if got != partitions {
			return 0, &outboxtype.PartitionMismatchError{Topic: topic, Registered: got, Requested: partitions}
		}
		if registeredForwardOnly != forwardOnly {
			return 0, &outboxtype.ConfigError{Field: "ForwardOnly", Reason: fmt.Sprintf(
				"topic %q is registered %s; a topic's path is fixed at registration: register it as it is, or use a new topic", topic, pathName(registeredForwardOnly))}
		}
		return got, nil
	}
	return 0, fmt.Errorf("outbox: register topic %q: concurrent registration did not settle", topic)
}

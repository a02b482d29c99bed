// Package jetstream is the forwarder's target for NATS JetStream: a
// forwarder.Forwarder with a jetstream.Target relays outbox messages to
// JetStream subjects in watermill-nats's message format, each with header
// Nats-Msg-Id set to the message's stable id, so that the server drops the
// copies a retry sends within the stream's duplicate window. Importing it
// links the NATS client and no Kafka client.
//
//	target, err := jetstream.NewTarget(jetstream.Config{URL: "nats://nats:4222"}, logger)
//	defer target.Close()
//	fwd, err := forwarder.NewForwarder(forwarder.Config{
//		Subscriber: outbox.SubscriberConfig{Pool: pool, RejectHandler: deadLetters},
//		Topics:     []string{"orders"},
//		Target:     target,
//	}, logger)
//
// See docs/forwarder.md.
package jetstream

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/forwarder"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// Target is a forwarder.Target.
var _ forwarder.Target = (*Target)(nil)

// Config configures a Target.
type Config struct {
	// URL of the NATS server(s), comma-separated; the target then owns its
	// connection. Either URL or Conn is required.
	URL string
	// Options are extra options for the connection made from URL. The
	// target adds nats.ReconnectBufSize(-1) and nats.MaxReconnects(-1) after
	// them (see Conn).
	Options []nats.Option
	// Conn is a connection to use instead of URL; the target does not close
	// it. It must have been made with nats.ReconnectBufSize(-1): with a
	// reconnect buffer, messages published while the connection is down are
	// held and sent after the reconnect while those in flight when it broke
	// are lost, so a message could be stored after one that came before it,
	// and the server's de-duplication would then drop the resent one.
	Conn *nats.Conn
	// AckTimeout bounds the wait for the acknowledgement of a publish
	// (default 10 s); the send's own deadline may end it sooner.
	AckTimeout time.Duration
	// Marshaler builds the NATS messages (default watermill-nats's
	// NATSMarshaler, so that watermill-nats subscribers read them as usual:
	// metadata in headers, the UUID in header "_watermill_message_uuid").
	Marshaler wmnats.Marshaler
	// KeySubjects publishes each message to a subject of its key:
	// "<subject>.<partition key>" (a stream must cover "<subject>.>"), so
	// that a stream with one message per subject (MaxMsgsPerSubject 1, or
	// a KV bucket: subject "$KV.<bucket>") keeps each key's latest message,
	// and a tombstone (outbox.Tombstone) purges its key: it is published
	// with headers Nats-Rollup "sub" and KV-Operation "PURGE", which make
	// the server remove every earlier message of the subject (the stream
	// must allow rollups, AllowRollup; else the server refuses the
	// tombstone, which is rejected). A message without a key, or whose key
	// is no subject ('*', '>', spaces, an empty token), is rejected. Off by
	// default: the subject is the target topic, and a tombstone is
	// published as a message with an empty body and header
	// outbox_tombstone, removing nothing (docs/forwarder.md, "Tombstones").
	KeySubjects bool
	// CloudEvents sends each message as a CloudEvent 1.0 of the NATS
	// protocol binding (forwarder.CloudEvents; off by default). Binary
	// mode: the body is the data, each attribute a header "ce-<name>"
	// (ce-specversion, ce-id, ce-source, ce-type, ce-time, ce-subject =
	// the partition key, ce-datacontenttype), values percent-encoded as
	// the binding requires, next to the Marshaler's headers. Structured
	// mode: the body is the event in the JSON event format, header
	// Content-Type "application/cloudevents+json". A tombstone goes in
	// binary mode in both.
	CloudEvents forwarder.CloudEvents
}

func (c *Config) setDefaults() {
	if c.Marshaler == nil {
		c.Marshaler = &wmnats.NATSMarshaler{}
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 10 * time.Second
	}
}

// Validate reports the first impossible setting.
func (c Config) Validate() error {
	switch {
	case c.AckTimeout < 0:
		return &outboxtype.ConfigError{Field: "AckTimeout", Reason: "must be positive"}
	case c.URL == "" && c.Conn == nil:
		return &outboxtype.ConfigError{Field: "URL", Reason: "URL or Conn is required"}
	case c.URL != "" && c.Conn != nil:
		return &outboxtype.ConfigError{Field: "Conn", Reason: "set URL or Conn, not both"}
	case c.Conn != nil && c.Conn.Opts.ReconnectBufSize != -1:
		return &outboxtype.ConfigError{Field: "Conn", Reason: "must be made with nats.ReconnectBufSize(-1), or a reconnect can reorder messages"}
	}
	return c.CloudEvents.Validate()
}

// msgID is the Nats-Msg-Id of msg: its stable id, after its source when the
// forwarder has one (two databases number their messages alike, and the
// server would drop one source's message as a copy of another's); the
// UUID of a message that is not an outbox delivery.
func msgID(msg *message.Message) string {
	id := msg.Metadata.Get(outbox.MetadataID)
	if id == "" {
		return msg.UUID
	}
	if source := msg.Metadata.Get(outbox.MetadataSource); source != "" {
		return source + ":" + id
	}
	return id
}

// Target publishes to NATS JetStream: the messages of a batch are
// published asynchronously, in order, each with header Nats-Msg-Id set to
// the stable id (outbox.MetadataID; "<source>:<id>" from a forwarder with
// a source), and their acknowledgements are awaited
// together. The server drops a message whose id it stored within the
// stream's duplicate window (Duplicates, 2 minutes by default), so the
// copies a retry sends again never reach consumers.
//
// The subject is the target topic; a stream must cover it (the target
// creates no streams). A message refused for what it is (larger than the
// server's max_payload or the stream's MaxMsgSize, headers over 64 KiB, a
// metadata key that is no valid header name, a tombstone or key the target
// cannot publish as asked or a message it cannot make a CloudEvent of
// (tombstone.go, cloudevents.go; *outboxtype.MessageError), or a JetStream
// header from its metadata whose demand the stream cannot meet, such as
// Nats-Expected-Stream or Nats-TTL: docs/forwarder.md has the list) is
// taken out of the stream with outbox.Reject on its first attempt, the
// messages before it delivered by the same Send; other failures (no
// connection, no stream, timeouts, storage or resources) are transient. Publishing stops at the first
// publish that fails at once, so that no message of a partition is stored
// after one before it failed; messages published behind one the server
// refuses may be stored, and when the next Send publishes them again, the
// server drops them as duplicates.
type Target struct {
	cfg    Config
	logger watermill.LoggerAdapter
	nc     *nats.Conn
	own    bool
	js     natsjs.JetStream

	closeOnce sync.Once
}

// ErrConnect is what NewTarget returns (wrapped with the NATS client's
// error) when its first connection to URL fails.
var ErrConnect = errors.New("forwarder: jetstream: cannot connect to the NATS server at")

// redactURLs returns the comma-separated server URLs of a NATS URL with
// their passwords hidden, for an error message.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			parts[i] = u.Redacted()
		} else {
			parts[i] = "(an unparsable URL)"
		}
	}
	return strings.Join(parts, ",")
}

// NewTarget creates a Target; logger may be nil (no logging). With URL,
// the connection keeps reconnecting forever; the first connection attempt
// must succeed unless Options contain nats.RetryOnFailedConnect(true): a
// failed one returns an error matching ErrConnect (and the NATS client's
// error, e.g. nats.ErrNoServers).
func NewTarget(cfg Config, logger watermill.LoggerAdapter) (*Target, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	t := &Target{cfg: cfg, logger: logger.With(watermill.LogFields{"component": "outbox.forwarder.jetstream"}), nc: cfg.Conn}
	if t.nc == nil {
		opts := append(append([]nats.Option{nats.Name("watermill-outbox-forwarder")}, cfg.Options...),
			nats.ReconnectBufSize(-1), nats.MaxReconnects(-1))
		nc, err := nats.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w: check the URL and that nats-server runs there with JetStream (nats-server -js), or pass nats.RetryOnFailedConnect(true) in Options to start without it",
				ErrConnect, redactURLs(cfg.URL), err)
		}
		t.nc, t.own = nc, true
	}
	js, err := natsjs.New(t.nc, natsjs.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		if t.own {
			t.nc.Close()
		}
		return nil, fmt.Errorf("forwarder: jetstream: %w", err)
	}
	t.js = js
	return t, nil
}

// Close closes the connection the target made (not one given in Conn).
func (t *Target) Close() error {
	t.closeOnce.Do(func() {
		if t.own {
			t.nc.Close()
		}
	})
	return nil
}

// JetStream returns the JetStream handle the target publishes with (to
// create streams, for instance).
func (t *Target) JetStream() natsjs.JetStream { return t.js }

// Send implements forwarder.Target.
func (t *Target) Send(ctx context.Context, subject string, batch []*message.Message) (int, error) {
	if t.js == nil {
		return 0, errs.NotConstructed("jetstream.Target", "jetstream.NewTarget")
	}
	if err := checkBatch(batch); err != nil {
		return 0, err
	}
	futures := make([]natsjs.PubAckFuture, 0, len(batch))
	var stopErr error // why publishing stopped before the end of the batch
	for _, msg := range batch {
		nm, err := t.cfg.Marshaler.Marshal(subject, forwarder.Outgoing(msg))
		if err != nil {
			stopErr = &permanentError{fmt.Errorf("marshal message %s: %w", msg.UUID, err)}
			break
		}
		if err := t.shape(nm, subject, msg); err != nil {
			stopErr = &permanentError{err}
			break
		}
		id := msgID(msg)
		// No client-side retries: a retried publish could be stored after
		// the messages published behind it.
		f, err := t.js.PublishMsgAsync(nm, natsjs.WithMsgID(id), natsjs.WithRetryAttempts(0))
		if err != nil {
			if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg) {
				err = &permanentError{err}
			}
			stopErr = err
			break
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if isPermanentJetStreamError(err) {
				err = &permanentError{err}
			}
			return t.fail(batch, i, err)
		case <-ctx.Done():
			return i, fmt.Errorf("forwarder: jetstream: no acknowledgement in time: %w", context.Cause(ctx))
		}
	}
	if stopErr != nil {
		return t.fail(batch, len(futures), stopErr)
	}
	return len(batch), nil
}

// fail reports batch[:i] as done and batch[i] as failed with err; a
// permanent error rejects batch[i].
func (t *Target) fail(batch []*message.Message, i int, err error) (int, error) {
	var perm *permanentError
	if errors.As(err, &perm) {
		t.logger.Error("JetStream refuses the message for good: rejecting it", perm.err, watermill.LogFields{"id": batch[i].Metadata.Get(outbox.MetadataID)})
		return i, outbox.Reject(batch[i], fmt.Errorf("jetstream: %w", perm.err))
	}
	return i, fmt.Errorf("forwarder: jetstream: message %d of %d: %w", i+1, len(batch), err)
}

// isPermanentJetStreamError says whether a publish acknowledgement error
// means the message can never be stored: the stream judged the message
// itself (see permanentJetStreamCodes), not its own state or the server's.
func isPermanentJetStreamError(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && permanentJetStreamCodes[apiErr.ErrorCode]
}

// permanentError marks an error that no retry can cure.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// checkBatch refuses a batch holding a nil message, before anything is
// sent.
func checkBatch(batch []*message.Message) error {
	for i, m := range batch {
		if m == nil {
			return &outboxtype.MessageError{UUID: "(nil)", Reason: fmt.Sprintf("message %d (0-based) of the batch of %d is nil; nothing was sent", i, len(batch))}
		}
	}
	return nil
}

// permanentJetStreamCodes are nats-server's error codes (server/errors.json)
// that refuse one message for what it is: its size, or a JetStream header
// it carries (from metadata, which become headers) whose demand the stream
// cannot meet, so sending it again can only be refused again. Storage,
// resource and cluster errors (insufficient resources, store failed, no
// quorum, "temporarily unavailable") are not here: they pass.
var permanentJetStreamCodes = map[natsjs.ErrorCode]bool{
	10054: true, // JSStreamMessageExceedsMaximumErr: larger than the stream's MaxMsgSize
	10097: true, // JSStreamHeaderExceedsMaximumErr: headers larger than 64 KiB
	10060: true, // JSStreamNotMatchErr: Nats-Expected-Stream names another stream
	10070: true, // JSStreamWrongLastMsgIDErrF: Nats-Expected-Last-Msg-Id
	10071: true, // JSStreamWrongLastSequenceErrF: Nats-Expected-Last(-Subject)-Sequence
	10164: true, // JSStreamWrongLastSequenceConstantErr
	10193: true, // JSStreamExpectedLastSeqPerSubjectInvalid
	10165: true, // JSMessageTTLInvalidErr: Nats-TTL is no valid TTL
	10166: true, // JSMessageTTLDisabledErr: Nats-TTL on a stream without AllowMsgTTL
	10111: true, // JSStreamRollupFailedF: Nats-Rollup on a stream that denies it
	10168: true, // JSMessageIncrDisabledErr: Nats-Incr on a stream without counters
	10169: true, // JSMessageIncrMissingErr
	10170: true, // JSMessageIncrPayloadErr
	10171: true, // JSMessageIncrInvalidErr
	10188: true, // JSMessageSchedulesDisabledErr: Nats-Schedule on a stream without schedules
	10189: true, // JSMessageSchedulesPatternInvalidErr
	10190: true, // JSMessageSchedulesTargetInvalidErr
	10191: true, // JSMessageSchedulesTTLInvalidErr
	10192: true, // JSMessageSchedulesRollupInvalidErr
	10227: true, // JSMessageSourceHdrNotAllowedErr
}

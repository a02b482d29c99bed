package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/watermill-outbox/internal/dbsql"
	"github.com/millrace/watermill-outbox/internal/errs"
	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/pgexec"
	"github.com/millrace/watermill-outbox/internal/pgtext"
	"github.com/millrace/watermill-outbox/internal/termsafe"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// DedupKeyMetadata is the metadata key under which a message's dedup key
// travels: stored and delivered with the message, so consumers (and
// brokers the forwarder writes to) can read it. Set a key with DedupKey,
// which checks it.
const DedupKeyMetadata = "outbox_dedup_key"

// MaxDedupKeyBytes is the longest dedup key.
const MaxDedupKeyBytes = 512

// DefaultDedupWindow is the default PublisherConfig.DedupWindow.
const DefaultDedupWindow = 24 * time.Hour

// DedupKey gives msg a dedup key: when it is published, it is stored only
// if no message of the same topic was stored with the same key within the
// topic's window (PublisherConfig.DedupWindow, DedupWindows), counted from
// the publish of the message that was stored. Otherwise Publish leaves it
// out, returns nil as for a stored message, and marks it: Deduplicated(msg)
// is then true.
//
// The key is claimed in the caller's transaction, in the statement that
// writes the message: if that transaction rolls back, the key is free
// again. Of concurrent transactions publishing the same key, exactly one
// stores its message; the others wait for it to end (its commit makes them
// skip, its rollback lets one of them store). Within one Publish call, the
// first message of a key wins. The key is kept in the message's metadata
// (DedupKeyMetadata), where Publish reads it (and checks it again).
//
// A nil msg, an empty key, a key longer than MaxDedupKeyBytes or one that
// is not valid UTF-8 or holds a NUL byte, a control character (a line
// feed, a tab, an escape) or a format character (a bidirectional override,
// a zero-width character) is refused with an error matching
// ErrInvalidArgument, and msg is left unchanged.
func DedupKey(msg *message.Message, key string) error {
	if msg == nil {
		return errs.NilArgument("outbox.DedupKey: msg", "pass the message to be published")
	}
	if why := dedupKeyProblem(key); why != "" {
		return fmt.Errorf("%w: outbox.DedupKey of message %s: %s", ErrInvalidArgument, msg.UUID, why)
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	msg.Metadata.Set(DedupKeyMetadata, key)
	return nil
}

// Deduplicated reports whether the last Publish of msg left it out because
// its dedup key (DedupKey) was taken: another message of the topic claimed
// it within the window, in a committed transaction, an earlier Publish of
// the same transaction, or earlier in the same call. It is false for a
// message that was stored, that has no dedup key or that was never
// published, and for nil.
//
// The mark lives in msg's context (msg.Context()), which is never stored:
// Publish sets it on the messages it leaves out, after the statement, and
// clears it on every message it is given. Replacing the context with
// msg.SetContext drops it.
func Deduplicated(msg *message.Message) bool {
	if msg == nil {
		return false
	}
	skipped, _ := msg.Context().Value(dedupMark{}).(bool)
	return skipped
}

// dedupMark is the context key of Deduplicated's mark.
type dedupMark struct{}

func setDeduplicated(msg *message.Message, skipped bool) {
	msg.SetContext(context.WithValue(msg.Context(), dedupMark{}, skipped))
}

// dedupKeyProblem says what is wrong with a dedup key, "" when nothing.
func dedupKeyProblem(key string) string {
	switch {
	case key == "":
		return "the dedup key is empty"
	case len(key) > MaxDedupKeyBytes:
		return fmt.Sprintf("the dedup key is %d bytes long, more than MaxDedupKeyBytes (%d)", len(key), MaxDedupKeyBytes)
	case !pgtext.Storable(key):
		return "the dedup key must be valid UTF-8 without NUL bytes"
	}
	for i, r := range key {
		if termsafe.Unsafe(r) {
			return fmt.Sprintf("the dedup key holds the control or format character %U at byte %d, which would act on or hide text where it is shown (status, logs, the console): use printable characters", r, i)
		}
	}
	return ""
}

// validateDedupWindows checks the windows of a PublisherConfig.
func validateDedupWindows(c PublisherConfig) error {
	if c.DedupWindow < time.Microsecond {
		return &outboxtype.ConfigError{Field: "DedupWindow", Reason: fmt.Sprintf("must be at least 1µs (0: DefaultDedupWindow), got %v", c.DedupWindow)}
	}
	for topic, d := range c.DedupWindows {
		if err := names.Topic(topic); err != nil {
			return err
		}
		if d < time.Microsecond {
			return &outboxtype.ConfigError{Field: "DedupWindows[" + topic + "]", Reason: fmt.Sprintf("must be at least 1µs, got %v", d)}
		}
	}
	return nil
}

// dedupPlan is what a Publish call with dedup keys sends: per message, its
// key ("" for none) and whether it repeats a key of an earlier message of
// the call (then it is left out before the statement).
type dedupPlan struct {
	keys   []string
	repeat []bool
}

// planDedup reads the dedup keys of msgs and clears their marks from an
// earlier Publish. It returns nil when none has a key: the call then runs
// the statements of a call without dedup keys. A bad key is a
// *outboxtype.MessageError.
func planDedup(msgs []*message.Message) (*dedupPlan, error) {
	var (
		plan *dedupPlan
		seen map[string]struct{}
	)
	for i, m := range msgs {
		if Deduplicated(m) {
			setDeduplicated(m, false)
		}
		key, ok := m.Metadata[DedupKeyMetadata]
		if !ok {
			continue
		}
		if why := dedupKeyProblem(key); why != "" {
			return nil, &outboxtype.MessageError{UUID: m.UUID, Reason: "metadata " + DedupKeyMetadata + ": " + why}
		}
		if plan == nil {
			plan = &dedupPlan{keys: make([]string, len(msgs)), repeat: make([]bool, len(msgs))}
			seen = map[string]struct{}{}
		}
		plan.keys[i] = key
		if _, dup := seen[key]; dup {
			plan.repeat[i] = true
		}
		seen[key] = struct{}{}
	}
	return plan, nil
}

// dedupWindow is topic's window.
func (p *Publisher) dedupWindow(topic string) time.Duration {
	if d, ok := p.cfg.DedupWindows[topic]; ok {
		return d
	}
	return p.cfg.DedupWindow
}

// publishDedup writes batch, the encoded msgs, with plan's keys in one
// statement (dedup_keys.sql), marks the messages left out and returns how
// many were stored.
func (p *Publisher) publishDedup(ctx context.Context, q pgexec.Querier, topic string, msgs []*message.Message, batch encodedBatch, plan *dedupPlan) (int, error) {
	// The messages sent: all but repeats within the call. sent[j] is the
	// index in msgs of the statement's position j+1.
	sent := make([]int, 0, len(msgs))
	for i := range msgs {
		if !plan.repeat[i] {
			sent = append(sent, i)
		}
	}
	if len(sent) < len(msgs) {
		batch = batch.subset(sent)
	}
	keys := make([]string, len(sent))
	for j, i := range sent {
		keys[j] = plan.keys[i]
	}
	window := p.dedupWindow(topic).Microseconds()
	stmts := dbsql.For(p.cfg.Schema)
	var (
		skipped string
		n       int64 // notifications, or records written
	)
	var err error
	if p.cfg.Mode == ModeWAL {
		err = pgexec.QueryRow(ctx, q, stmts.DedupKeysEmit, []any{p.walSlot, p.walPrefix, walRecords(topic, batch), topic, keys, window}, &skipped, &n)
	} else {
		var channel any
		if p.notifyGate != nil && p.notifyGate.pass(time.Now(), p.cfg.NotifyInterval) {
			channel = p.channel
		}
		err = pgexec.QueryRow(ctx, q, stmts.DedupKeysInsertPending,
			[]any{topic, batch.partitions, batch.keys, batch.uuids, batch.metadata, batch.payloads, keys, window, channel}, &skipped, &n)
	}
	if err != nil {
		return 0, err
	}
	left := 0
	for i := range msgs {
		if plan.repeat[i] {
			setDeduplicated(msgs[i], true)
			left++
		}
	}
	for f := range strings.SplitSeq(skipped, ",") {
		if f == "" {
			continue
		}
		j, err := strconv.Atoi(f)
		if err != nil || j < 1 || j > len(sent) {
			return 0, fmt.Errorf("outbox: publish to %q: the statement returned %q as a position skipped", topic, skipped)
		}
		setDeduplicated(msgs[sent[j-1]], true)
		left++
	}
	return len(msgs) - left, nil
}

// subset returns the batch of the messages at idx, in that order.
func (b encodedBatch) subset(idx []int) encodedBatch {
	out := encodedBatch{
		partitions: make([]int32, len(idx)),
		keys:       make([]string, len(idx)),
		uuids:      make([]string, len(idx)),
		metadata:   make([]string, len(idx)),
		payloads:   make([][]byte, len(idx)),
		bytes:      b.bytes,
	}
	for j, i := range idx {
		out.partitions[j], out.keys[j], out.uuids[j], out.metadata[j], out.payloads[j] = b.partitions[i], b.keys[i], b.uuids[i], b.metadata[i], b.payloads[i]
	}
	return out
}

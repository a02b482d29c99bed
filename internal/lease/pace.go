package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/millrace/watermill-outbox/internal/names"
	"github.com/millrace/watermill-outbox/internal/notifier"
)

// How often Run's loop balances: every BalanceInterval while the group
// changes, stretched while it is settled and its changes are heard (on
// names.MembersChannel), never past another member's expiry.

// listen subscribes the manager to its group's changes (Config.Listen, or
// the Pool's shared LISTEN connection); nil when there is no way to hear
// them.
func (m *Manager) listen() Listening {
	channel := names.MembersChannel(m.cfg.Schema)
	mine := names.MembersPayload(m.cfg.Group, m.cfg.Topic)
	every := names.MembersPayload(m.cfg.Group, "")
	fn := func(payload string) {
		// "": the subscription (re)started and may have missed some.
		if payload == "" || payload == mine || payload == every {
			select {
			case m.changed <- struct{}{}:
			default:
			}
		}
	}
	switch {
	case m.cfg.Listen != nil:
		return m.cfg.Listen(channel, fn)
	case m.cfg.Pool != nil && m.cfg.Store == nil:
		return notifier.Listen(m.cfg.Pool, channel, m.logger, fn)
	}
	return nil
}

// balancePace is how long Run's loop waits between balances: min while
// the group changes or its changes cannot be heard, doubling up to max
// while it is settled and they can; never past the moment another
// member's heartbeat expires, when its partitions may come free.
type balancePace struct {
	min, max  time.Duration
	listening Listening
	cur       time.Duration
}

// expiryMargin is how long after another member's expiry the next balance
// looks: a balance at that very moment could still find it live.
const expiryMargin = 10 * time.Millisecond

// next returns the wait after a balance that found what r says.
func (p *balancePace) next(r balanced) time.Duration {
	if r.settled && p.listening != nil && p.listening.Live() {
		p.cur = min(max(2*p.cur, p.min), p.max)
	} else {
		p.cur = p.min
	}
	wait := p.cur
	if r.othersExpireIn > 0 {
		wait = min(wait, r.othersExpireIn+expiryMargin)
	}
	return wait
}

// restart goes back to the shortest wait: the group is changing.
func (p *balancePace) restart() { p.cur = p.min }

// start creates the cursor rows (one statement) and forgets long-dead
// members.
func (m *Manager) start(ctx context.Context) error {
	if err := m.store.CreateCursors(ctx, m.group, m.cfg.Partitions, m.cfg.StartFromNewest); err != nil {
		return fmt.Errorf("lease: create cursors of group %q on topic %q: %w", m.cfg.Group, m.cfg.Topic, err)
	}
	if err := m.store.ExpireMembers(ctx, m.group, 10*m.cfg.TTL); err != nil {
		m.logger.Error("Cannot remove dead members", err, nil)
	}
	return nil
}

// opContext bounds one database round trip of the Run loop, so that a
// stuck connection cannot stall renewals forever.
func (m *Manager) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, m.cfg.TTL/2)
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

package console

import (
	"fmt"
	"sync"
	"time"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/outboxtype"
)

// The history the charts draw: how far back, and how often a sample.
const (
	// DefaultHistoryWindow is how far back the charts go when
	// Config.HistoryWindow is zero.
	DefaultHistoryWindow = 10 * time.Minute
	// DefaultHistoryInterval is the time between two samples when
	// Config.HistoryInterval is zero.
	DefaultHistoryInterval = 5 * time.Second
	// MaxHistoryPoints bounds HistoryWindow / HistoryInterval: the samples
	// kept per consumer group and topic (each a few dozen bytes).
	MaxHistoryPoints = 10_000
)

// validateHistory checks the history settings, zero meaning the default.
func (c Config) validateHistory() error {
	window, interval := c.HistoryWindow, c.HistoryInterval
	if window < 0 || interval < 0 {
		return &outboxtype.ConfigError{Field: "HistoryWindow/HistoryInterval", Reason: "must not be negative"}
	}
	if window == 0 {
		window = DefaultHistoryWindow
	}
	if interval == 0 {
		interval = DefaultHistoryInterval
	}
	if window < 2*interval {
		return &outboxtype.ConfigError{Field: "HistoryWindow", Reason: fmt.Sprintf("%s holds fewer than two samples %s apart (HistoryInterval)", window, interval)}
	}
	if window/interval > MaxHistoryPoints {
		return &outboxtype.ConfigError{Field: "HistoryInterval", Reason: fmt.Sprintf("%s over a HistoryWindow of %s is more than %d samples per group", interval, window, MaxHistoryPoints)}
	}
	return nil
}

// sample is one point of a group's history on a topic.
type sample struct {
	// At is the database clock when the status was read (admin.Report.At).
	At time.Time `json:"at"`
	// Lag is the messages the group has yet to finish (GroupStatus.Lag),
	// LagSeconds how long the oldest of them has waited
	// (GroupStatus.MaxLagSeconds).
	Lag        int64   `json:"lag"`
	LagSeconds float64 `json:"lag_seconds"`
	// Throughput is the messages the group finished per second: how far
	// its cursors moved, over the last 5 s (throughputSpan; or since the
	// previous sample, if that is longer ago), so that cursors committed
	// in batches do not draw spikes. Nil when it is not known: the first
	// sample, the first after a gap, or a cursor moved back (a reset).
	Throughput *float64 `json:"throughput"`

	// run numbers the stretches of samples without a gap or a reset, done
	// counts the messages finished since its start: the throughput is
	// their difference between two samples of a run.
	run  int
	done int64
}

// throughputSpan is the time the throughput is averaged over, at least.
const throughputSpan = 5 * time.Second

// seriesKey names one history: a consumer group on a topic.
type seriesKey struct{ topic, group string }

// series is the samples of one group on one topic, oldest first, in a
// ring of fixed capacity.
type series struct {
	ring    []sample
	start   int // index of the oldest
	n       int
	cursors map[int]int64 // each partition's cursor at the last sample
	sampled time.Time     // local clock of the last sample: when the next is due
}

func (s *series) push(v sample) {
	if s.n < len(s.ring) {
		s.ring[(s.start+s.n)%len(s.ring)] = v
		s.n++
		return
	}
	s.ring[s.start] = v
	s.start = (s.start + 1) % len(s.ring)
}

// last is the newest sample (ok false when there is none).
func (s *series) last() (sample, bool) {
	if s.n == 0 {
		return sample{}, false
	}
	return s.ring[(s.start+s.n-1)%len(s.ring)], true
}

// since copies the samples not older than from, oldest first.
func (s *series) since(from time.Time) []sample {
	out := make([]sample, 0, s.n)
	for i := range s.n {
		v := s.ring[(s.start+i)%len(s.ring)]
		if !v.At.Before(from) {
			out = append(out, v)
		}
	}
	return out
}

// history holds the recent samples of every group the console was asked
// about. It samples nothing on its own: the console records the status
// it reads for its pages and APIs (record), at most once per interval per
// group, and the history API reads the status when a sample is due. An
// idle console costs nothing; while a group page is open, its live
// updates sample that group. What nobody looked at for a whole window is
// dropped, so that memory follows the groups being watched.
type history struct {
	window, interval time.Duration
	// gap is the distance between two samples past which the charts
	// break the line: nobody sampled in between.
	gap time.Duration

	mu     sync.Mutex
	series map[seriesKey]*series
}

// newHistory keeps window of samples every interval; refresh is how often
// an open page polls (a sample cannot come more often than that).
func newHistory(window, interval, refresh time.Duration) *history {
	return &history{window: window, interval: interval, gap: 3 * max(interval, refresh), series: map[seriesKey]*series{}}
}

// capacity is the samples a series holds: a window of them, and one to
// spare for a window that starts exactly on a sample.
func (h *history) capacity() int { return int(h.window/h.interval) + 2 }

// due says whether the group on the topic needs a sample at now.
func (h *history) due(k seriesKey, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[k]
	return s == nil || now.Sub(s.sampled) >= h.interval
}

// record adds a sample for every group of rep whose sample is due at now
// (the local clock), and drops the series nobody sampled for a window.
func (h *history) record(rep admin.Report, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range rep.Topics {
		for _, g := range t.Groups {
			k := seriesKey{t.Topic, g.Group}
			s := h.series[k]
			if s == nil {
				s = &series{ring: make([]sample, h.capacity())}
				h.series[k] = s
			} else if now.Sub(s.sampled) < h.interval {
				continue
			}
			h.add(s, rep.At, g)
			s.sampled = now
		}
	}
	for k, s := range h.series {
		if now.Sub(s.sampled) > h.window {
			delete(h.series, k)
		}
	}
}

// add appends the sample of g read at at to s, with the throughput from
// how far its cursors moved.
func (h *history) add(s *series, at time.Time, g admin.GroupStatus) {
	cursors := make(map[int]int64, len(g.Partitions))
	for _, p := range g.Partitions {
		cursors[p.Partition] = p.Cursor
	}
	v := sample{At: at, Lag: g.Lag, LagSeconds: g.MaxLagSeconds}
	prev, ok := s.last()
	moved, known := finished(s.cursors, cursors)
	switch {
	case !ok:
	case !known || !at.After(prev.At) || at.Sub(prev.At) > h.gap:
		v.run = prev.run + 1 // a new run: the throughput is not known yet
	default:
		v.run, v.done = prev.run, prev.done+moved
		from := s.runStart(v.run, at, max(throughputSpan, h.interval))
		rate := float64(v.done-from.done) / at.Sub(from.At).Seconds()
		v.Throughput = &rate
	}
	s.push(v)
	s.cursors = cursors
}

// finished is how many messages the cursors say were finished from prev
// to cur, over the partitions both have. Not known (false) without a
// previous sample or when a cursor moved back (a reset: the movement says
// nothing about work done).
func finished(prev, cur map[int]int64) (int64, bool) {
	if prev == nil {
		return 0, false
	}
	var moved int64
	for p, c := range cur {
		was, ok := prev[p]
		if !ok {
			continue
		}
		if c < was {
			return 0, false
		}
		moved += c - was
	}
	return moved, true
}

// runStart is the sample of run the throughput at at is measured from:
// the oldest within span before at, or the newest if none is.
func (s *series) runStart(run int, at time.Time, span time.Duration) sample {
	from, _ := s.last()
	for i := s.n - 2; i >= 0; i-- {
		v := s.ring[(s.start+i)%len(s.ring)]
		if v.run != run || at.Sub(v.At) > span {
			break
		}
		from = v
	}
	return from
}

// samples returns the group's samples of the last window (up to its newest
// sample), oldest first, and whether the console has any.
func (h *history) samples(k seriesKey) ([]sample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[k]
	if s == nil {
		return nil, false
	}
	newest, ok := s.last()
	if !ok {
		return nil, true
	}
	return s.since(newest.At.Add(-h.window)), true
}

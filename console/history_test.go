package console

import (
	"errors"
	"testing"
	"time"

	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// report is a status snapshot read at at of group billing on topic orders,
// whose partitions have the cursors given.
func report(at time.Time, lag int64, lagSeconds float64, cursors ...int64) admin.Report {
	g := admin.GroupStatus{Group: "billing", Lag: lag, MaxLagSeconds: lagSeconds}
	for p, c := range cursors {
		g.Partitions = append(g.Partitions, admin.PartitionStatus{Group: "billing", Topic: "orders", Partition: p, Cursor: c})
	}
	return admin.Report{At: at, Topics: []admin.TopicStatus{{Topic: "orders", Groups: []admin.GroupStatus{g}}}}
}

var billing = seriesKey{"orders", "billing"}

// The throughput is how far the cursors moved over the database time
// between two samples; it is not known for the first sample, after a gap
// nobody sampled, or when a cursor went back (a reset).
func TestThroughputFromCursorMoves(t *testing.T) {
	h := newHistory(time.Minute, time.Second, time.Second)
	t0, now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()
	h.record(report(t0, 100, 3, 10, 20), now)
	h.record(report(t0.Add(2*time.Second), 80, 2.5, 20, 30), now.Add(2*time.Second))       // 20 messages in 2 s
	h.record(report(t0.Add(4*time.Second), 70, 2, 15, 45), now.Add(4*time.Second))         // partition 0 reset back
	h.record(report(t0.Add(5*time.Second), 60, 1, 15, 45, 9), now.Add(5*time.Second))      // a partition appears: not counted
	h.record(report(t0.Add(6*time.Second), 50, 1, 16, 46, 9), now.Add(6*time.Second))      // 2 messages in 1 s
	h.record(report(t0.Add(20*time.Second), 40, 0.5, 30, 60, 90), now.Add(20*time.Second)) // after a gap (> 3 s)
	got, ok := h.samples(billing)
	if !ok || len(got) != 6 {
		t.Fatalf("%d samples (%v), want 6", len(got), ok)
	}
	want := []*float64{nil, ptr(10), nil, ptr(0), ptr(1), nil} // 2 messages in the 2 s since the reset
	for i, s := range got {
		switch {
		case (s.Throughput == nil) != (want[i] == nil):
			t.Errorf("sample %d: throughput %v, want %v", i, deref(s.Throughput), deref(want[i]))
		case s.Throughput != nil && *s.Throughput != *want[i]:
			t.Errorf("sample %d: throughput %v, want %v", i, *s.Throughput, *want[i])
		}
	}
	if got[1].Lag != 80 || got[1].LagSeconds != 2.5 || !got[1].At.Equal(t0.Add(2*time.Second)) {
		t.Errorf("sample 1 = %+v, want lag 80, 2.5 s, at the report's time", got[1])
	}
}

// Cursors committed in batches do not draw spikes: the throughput is
// averaged over the last 5 s (throughputSpan), or one interval when that
// is longer.
func TestThroughputIsAveragedOverTheSpan(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		batch    int64 // committed at the 4th and 8th sample
		want     []float64
	}{
		// 10 in 1 s at t = 4 s and 8 s: 2.5/s at 4 s (since t = 0), then
		// over 5 s; never a spike of 10/s.
		{time.Second, 10, []float64{0, 0, 0, 2.5, 2, 2, 2, 4, 2, 2}},
		// Samples further apart than the span: since the previous one.
		{10 * time.Second, 40, []float64{0, 0, 0, 4, 0, 0, 0, 4, 0, 0}},
	} {
		h := newHistory(10*time.Minute, tc.interval, time.Second)
		t0, now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()
		cursor := int64(0)
		for i := range 11 {
			if i == 4 || i == 8 {
				cursor += tc.batch
			}
			d := time.Duration(i) * tc.interval
			h.record(report(t0.Add(d), 0, 0, cursor), now.Add(d))
		}
		got, _ := h.samples(billing)
		for i, s := range got[1:] {
			if s.Throughput == nil || *s.Throughput != tc.want[i] {
				t.Errorf("interval %s, sample %d: throughput %v, want %v", tc.interval, i+1, deref(s.Throughput), tc.want[i])
			}
		}
	}
}

// A sample is taken at most once per interval (by the local clock):
// reports read in between are not recorded.
func TestOneSamplePerInterval(t *testing.T) {
	h := newHistory(time.Minute, 5*time.Second, time.Second)
	t0, now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()
	if !h.due(billing, now) {
		t.Fatal("a group never sampled is not due")
	}
	for i := range 11 { // a report every second for 10 s
		d := time.Duration(i) * time.Second
		h.record(report(t0.Add(d), int64(i), 0, int64(i)), now.Add(d))
	}
	got, _ := h.samples(billing)
	if len(got) != 3 || got[0].Lag != 0 || got[1].Lag != 5 || got[2].Lag != 10 {
		t.Fatalf("samples %+v, want those at 0, 5 and 10 s", got)
	}
	if h.due(billing, now.Add(14*time.Second)) || !h.due(billing, now.Add(15*time.Second)) {
		t.Fatal("due before the interval passed, or not after")
	}
}

// The ring keeps the last window of samples, oldest first; a series that
// nobody sampled for a whole window is dropped.
func TestRingKeepsTheWindowAndForgetsTheUnwatched(t *testing.T) {
	h := newHistory(10*time.Second, time.Second, time.Second)
	t0, now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()
	for i := range 100 {
		d := time.Duration(i) * time.Second
		h.record(report(t0.Add(d), int64(i), 0, int64(i)), now.Add(d))
	}
	got, _ := h.samples(billing)
	if len(got) != 11 || got[0].Lag != 89 || got[10].Lag != 99 {
		t.Fatalf("%d samples from lag %d to %d, want the 11 of the last 10 s (89..99)", len(got), got[0].Lag, got[len(got)-1].Lag)
	}
	if n := len(h.series[billing].ring); n != h.capacity() || n != 12 {
		t.Fatalf("ring of %d, want the window's 12", n)
	}
	other := report(t0.Add(200*time.Second), 1, 0, 1)
	other.Topics[0].Groups[0].Group = "shipping"
	h.record(other, now.Add(200*time.Second))
	if _, ok := h.samples(billing); ok {
		t.Fatal("a group nobody sampled for a window is still kept")
	}
	if _, ok := h.samples(seriesKey{"orders", "shipping"}); !ok {
		t.Fatal("the group just sampled is gone")
	}
}

// The history settings are checked field by field, zero meaning the
// default, and refused with a ConfigError.
func TestHistoryConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		window, interval time.Duration
		ok               bool
	}{
		{0, 0, true},
		{time.Minute, 0, true},
		{0, time.Second, true},
		{time.Hour, 500 * time.Millisecond, true},
		{-time.Second, 0, false},
		{0, -time.Second, false},
		{5 * time.Second, 5 * time.Second, false},  // one sample
		{0, 6 * time.Minute, false},                // the default window holds one
		{24 * time.Hour, time.Second, false},       // 86,400 samples per group
		{time.Minute, time.Millisecond * 6, true},  // 10,000
		{time.Minute, time.Millisecond * 5, false}, // 12,000
	} {
		err := Config{HistoryWindow: tc.window, HistoryInterval: tc.interval}.validateHistory()
		if (err == nil) != tc.ok {
			t.Errorf("window %s, interval %s: %v, want ok %v", tc.window, tc.interval, err, tc.ok)
		}
		if err != nil && !errors.Is(err, sentinel.ErrInvalidConfig) {
			t.Errorf("window %s, interval %s: %v is not an ErrInvalidConfig", tc.window, tc.interval, err)
		}
	}
}

func ptr(f float64) *float64 { return &f }

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}

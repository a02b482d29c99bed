package admin

// Summary totals a Report into one line: what an operator of several
// sources (databases) reads first, one line per source and a total
// (outbox status --config, the console's sources page).
type Summary struct {
	// Topics and Partitions registered.
	Topics     int `json:"topics"`
	Partitions int `json:"partitions"`
	// Sequenced and Pending messages (TopicStatus.Sequenced and
	// Unsequenced, summed).
	Sequenced int64 `json:"sequenced"`
	Pending   int64 `json:"pending"`
	// Delayed of the Pending wait for their time (outbox.DeliverAt).
	Delayed int64 `json:"delayed"`
	// Lag sums every group's Lag on every topic: the deliveries owed (a
	// message two groups have yet to handle counts twice).
	// MaxLagSeconds is the largest MaxLagSeconds of any group.
	Lag           int64   `json:"lag"`
	MaxLagSeconds float64 `json:"max_lag_seconds"`
	// Partitions of every group that are leased, paused, failing or
	// backing off, and the pending dead letters of every group.
	Leased      int   `json:"leased"`
	Paused      int   `json:"paused"`
	Failing     int   `json:"failing"`
	BackingOff  int   `json:"backing_off"`
	DeadLetters int64 `json:"dead_letters"`
}

// Summary totals the report.
func (r Report) Summary() Summary {
	var s Summary
	for _, t := range r.Topics {
		s.Topics++
		s.Partitions += t.Partitions
		s.Sequenced += t.Sequenced
		s.Pending += t.Unsequenced
		s.Delayed += t.Delayed
		for _, g := range t.Groups {
			s.Lag += g.Lag
			s.MaxLagSeconds = max(s.MaxLagSeconds, g.MaxLagSeconds)
			s.Leased += g.Leased
			s.Paused += g.Paused
			s.Failing += g.Failing
			s.BackingOff += g.BackingOff
			s.DeadLetters += g.DeadLetters
		}
	}
	return s
}

// Plus is s and o together: the total of two sources (MaxLagSeconds the
// larger of the two).
func (s Summary) Plus(o Summary) Summary {
	return Summary{
		Topics: s.Topics + o.Topics, Partitions: s.Partitions + o.Partitions,
		Sequenced: s.Sequenced + o.Sequenced, Pending: s.Pending + o.Pending, Delayed: s.Delayed + o.Delayed,
		Lag: s.Lag + o.Lag, MaxLagSeconds: max(s.MaxLagSeconds, o.MaxLagSeconds),
		Leased: s.Leased + o.Leased, Paused: s.Paused + o.Paused, Failing: s.Failing + o.Failing,
		BackingOff: s.BackingOff + o.BackingOff, DeadLetters: s.DeadLetters + o.DeadLetters,
	}
}

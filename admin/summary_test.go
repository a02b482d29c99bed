package admin

import "testing"

func TestSummaryTotalsAReportAndTwoSources(t *testing.T) {
	r := Report{Topics: []TopicStatus{
		{Topic: "orders", Partitions: 4, Sequenced: 100, Unsequenced: 3, Groups: []GroupStatus{
			{Group: "a", Lag: 10, MaxLagSeconds: 2, Leased: 4, Failing: 1, DeadLetters: 2},
			{Group: "b", Lag: 5, MaxLagSeconds: 7, Leased: 3, Paused: 1, BackingOff: 1},
		}},
		{Topic: "invoices", Partitions: 2, Sequenced: 20, Groups: []GroupStatus{{Group: "a", Lag: 1, MaxLagSeconds: 1, DeadLetters: 1}}},
	}}
	want := Summary{Topics: 2, Partitions: 6, Sequenced: 120, Pending: 3, Lag: 16, MaxLagSeconds: 7,
		Leased: 7, Paused: 1, Failing: 1, BackingOff: 1, DeadLetters: 3}
	got := r.Summary()
	if got != want {
		t.Fatalf("Summary = %+v, want %+v", got, want)
	}
	other := Summary{Topics: 1, Partitions: 8, Sequenced: 5, Lag: 2, MaxLagSeconds: 30, DeadLetters: 1}
	total := got.Plus(other)
	if total.Topics != 3 || total.Partitions != 14 || total.Sequenced != 125 || total.Lag != 18 || total.MaxLagSeconds != 30 || total.DeadLetters != 4 || total.Leased != 7 {
		t.Fatalf("Plus = %+v", total)
	}
}

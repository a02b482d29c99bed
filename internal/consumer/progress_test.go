package consumer

import "testing"

// How many messages the next read may take around the suspects (crash
// evidence): one when the head is a suspect (the last one included), fewer
// when a suspect comes before the limit, the limit once the cursor passed
// them (and they are forgotten).
func TestReadLimitAroundTheSuspects(t *testing.T) {
	for _, tt := range []struct {
		name     string
		cursor   int64
		suspects span
		want     int
		forgets  bool
	}{
		{name: "no suspects", cursor: 0, want: 8},
		{name: "the head is the first suspect", cursor: 0, suspects: span{1, 3}, want: 1},
		{name: "the head is the last suspect", cursor: 2, suspects: span{1, 3}, want: 1},
		{name: "the cursor passed them", cursor: 3, suspects: span{1, 3}, want: 8, forgets: true},
		{name: "a suspect before the limit", cursor: 0, suspects: span{5, 9}, want: 4},
		{name: "a suspect after the limit", cursor: 0, suspects: span{20, 30}, want: 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := progress{cursor: tt.cursor, suspects: tt.suspects}
			if got := p.readLimit(8); got != tt.want {
				t.Fatalf("readLimit(8) = %d, want %d", got, tt.want)
			}
			if forgot := p.suspects == (span{}) && tt.suspects != (span{}); forgot != tt.forgets {
				t.Fatalf("suspects %v after the read: forgotten %v, want %v", p.suspects, forgot, tt.forgets)
			}
		})
	}
}

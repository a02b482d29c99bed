package console

import (
	"strconv"
	"strings"

	"github.com/millrace/watermill-outbox/admin"
)

// A partition's state on the grid: the class colours its tile and row,
// the label lists every condition. console.js derives the same from the
// status API (function stateOf there): change both together.
type partitionState struct {
	Class string `json:"class"`
	Label string `json:"label"`
}

// stateClasses are the grid's colours, the most pressing first: a
// partition takes the first that applies. The legend lists them in this
// order.
var stateClasses = []struct{ Class, Name string }{
	{"paused", "paused"},
	{"no-lease", "no lease"},
	{"backing-off", "backing off"},
	{"failing", "failing"},
	{"held", "held keys"},
	{"degraded", "degraded"},
	{"unknown", "unknown"},
	{"ok", "ok"},
}

// stateOf is the state of one partition. It is "ok" only when everything
// says so: a live lease, the batching state recorded as normal, no
// failure, no backoff, no held key. A batching state the console does not
// know is "unknown", never "ok".
func stateOf(p admin.PartitionStatus) partitionState {
	var labels []string
	class := ""
	flag := func(c, label string) {
		if class == "" {
			class = c
		}
		labels = append(labels, label)
	}
	if p.Paused {
		flag("paused", "paused")
	} else if !p.Leased {
		flag("no-lease", "no lease")
	}
	if p.BackingOff {
		flag("backing-off", "backing-off")
	} else if p.Attempts > 0 {
		flag("failing", "failing ("+strconv.Itoa(p.Attempts)+" attempts)")
	}
	if p.Unanswered > 0 {
		flag("failing", "unanswered delivery")
	}
	if len(p.HeldKeys) > 0 {
		flag("held", strconv.Itoa(len(p.HeldKeys))+" keys held")
	}
	if p.IsolationFullSince != nil {
		flag("held", "isolation-full")
	}
	switch p.AdaptiveState {
	case "normal":
	case "degraded":
		flag("degraded", "degraded")
	default:
		flag("unknown", "batching state "+strconv.Quote(p.AdaptiveState)+" unknown to this console")
	}
	if class == "" {
		return partitionState{Class: "ok", Label: "ok"}
	}
	return partitionState{Class: class, Label: strings.Join(labels, ", ")}
}

// legendEntry is one state of the grid's legend and how many partitions
// are in it.
type legendEntry struct {
	Class, Name string
	Count       int
}

// legend counts the partitions of each state, in stateClasses' order.
func legend(parts []admin.PartitionStatus) []legendEntry {
	counts := map[string]int{}
	for _, p := range parts {
		counts[stateOf(p).Class]++
	}
	out := make([]legendEntry, len(stateClasses))
	for i, s := range stateClasses {
		out[i] = legendEntry{Class: s.Class, Name: s.Name, Count: counts[s.Class]}
	}
	return out
}

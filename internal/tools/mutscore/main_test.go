package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// The summary counts each file's mutants by outcome, computes the share
// killed of those covered, and lists the survivors.
func TestSummarizeCountsPerFileAndLists(t *testing.T) {
	var r report
	err := json.Unmarshal([]byte(`{"files": [
		{"file_name": "b.go", "mutations": [{"type": "CONDITIONALS_NEGATION", "status": "KILLED", "line": 1, "column": 2},
			{"type": "ARITHMETIC_BASE", "status": "LIVED", "line": 3, "column": 4}, {"status": "NOT COVERED"}, {"status": "TIMED OUT"}]},
		{"file_name": "a.go", "mutations": [{"status": "KILLED"}, {"status": "KILLED"}, {"status": "KILLED"}]}]}`), &r)
	if err != nil {
		t.Fatal(err)
	}
	table, total := summarize(r, true)
	if total.killed != 4 || total.lived != 1 || total.notCovered != 1 || total.other != 1 || total.efficacy() != 80 {
		t.Fatalf("total %+v, efficacy %v", total, total.efficacy())
	}
	for _, want := range []string{"a.go       3      0            0         100", "b.go       1      1            1          50", "total       4      1            1        80.0", "b.go:3:4 ARITHMETIC_BASE"} {
		if !strings.Contains(table, want) {
			t.Errorf("the summary lacks %q:\n%s", want, table)
		}
	}
	if strings.Index(table, "a.go") > strings.Index(table, "b.go") {
		t.Errorf("files not in name order:\n%s", table)
	}
}

// Command mutscore summarises a go-gremlins JSON report (gremlins unleash
// -o): per file, the mutants killed, lived and not covered, and the share
// killed of those the tests covered (the efficacy). It exits 1 when the
// whole report's efficacy is below -min percent. scripts/mutation-score
// runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
)

// report is the part of gremlins' JSON report mutscore reads.
type report struct {
	Files []struct {
		Name      string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

// summarize renders r: a table of the mutants per file and in total, and
// with lived the list of the mutants that lived; total is the whole
// report's counts.
func summarize(r report, lived bool) (string, counts) {
	var b strings.Builder
	sort.Slice(r.Files, func(i, j int) bool { return r.Files[i].Name < r.Files[j].Name })
	var total counts
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "file\tkilled\tlived\tnot covered\tefficacy %\t")
	var survivors []string
	for _, f := range r.Files {
		var c counts
		for _, m := range f.Mutations {
			switch m.Status {
			case "KILLED":
				c.killed++
			case "LIVED":
				c.lived++
				survivors = append(survivors, fmt.Sprintf("%s:%d:%d %s", f.Name, m.Line, m.Column, m.Type))
			case "NOT COVERED":
				c.notCovered++
			default: // TIMED OUT, NOT VIABLE, SKIPPED
				c.other++
			}
		}
		total.killed += c.killed
		total.lived += c.lived
		total.notCovered += c.notCovered
		total.other += c.other
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%.0f\t\n", f.Name, c.killed, c.lived, c.notCovered, c.efficacy())
	}
	fmt.Fprintf(w, "total\t%d\t%d\t%d\t%.1f\t\n", total.killed, total.lived, total.notCovered, total.efficacy())
	_ = w.Flush()
	if lived && len(survivors) > 0 {
		b.WriteString("\nlived (a change no unit test notices):\n")
		for _, s := range survivors {
			b.WriteString("  " + s + "\n")
		}
	}
	return b.String(), total
}

// counts are one file's (or the total's) mutants by outcome.
type counts struct{ killed, lived, notCovered, other int }

func (c counts) efficacy() float64 {
	if c.killed+c.lived == 0 {
		return 100
	}
	return 100 * float64(c.killed) / float64(c.killed+c.lived)
}

func main() {
	minEfficacy := flag.Float64("min", 80, "fail below this efficacy (percent of covered mutants killed)")
	lived := flag.Bool("lived", true, "list the mutants that lived")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: mutscore [-min 80] gremlins-report.json")
		os.Exit(2)
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var r report
	if err := json.Unmarshal(data, &r); err != nil {
		fmt.Fprintln(os.Stderr, "mutscore: not a gremlins report:", err)
		os.Exit(2)
	}
	table, total := summarize(r, *lived)
	fmt.Print(table)
	if total.efficacy() < *minEfficacy {
		fmt.Fprintf(os.Stderr, "mutscore: efficacy %.1f %% is below %.0f %%\n", total.efficacy(), *minEfficacy)
		os.Exit(1)
	}
}

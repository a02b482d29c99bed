package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every Go snippet of docs/testing.md is code that compiles and runs: its
// lines appear, in order and one after the other (indentation aside), in
// this example's test or in read-model's. A snippet edited in the doc
// alone, or code changed here alone, fails this test.
func TestDocsTestingShowsCodeTheseTestsRun(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	var sources [][]string
	for _, f := range []string{"main_test.go", filepath.Join("..", "read-model", "main_test.go")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources = append(sources, trimmedLines(string(b)))
	}
	snippets := goSnippets(string(doc))
	if len(snippets) < 3 {
		t.Fatalf("docs/testing.md has %d Go snippets, want at least 3 (the schema, RequirePublished, RunUntilIdle)", len(snippets))
	}
	for _, snippet := range snippets {
		lines := trimmedLines(snippet)
		found := false
		for _, src := range sources {
			if contains(src, lines) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("this snippet of docs/testing.md is in neither main_test.go nor ../read-model/main_test.go:\n%s", snippet)
		}
	}
}

// goSnippets returns the bodies of the ```go blocks of a Markdown text.
func goSnippets(md string) []string {
	var out []string
	var cur []string
	in := false
	for _, line := range strings.Split(md, "\n") {
		fence := strings.TrimSpace(line)
		switch {
		case !in && fence == "```go":
			in, cur = true, nil
		case in && fence == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return out
}

// trimmedLines returns the lines of s without their indentation, empty
// lines left out.
func trimmedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// contains reports whether want appears in have as consecutive lines.
func contains(have, want []string) bool {
	for i := 0; i+len(want) <= len(have); i++ {
		match := true
		for j := range want {
			if have[i+j] != want[j] {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

package main

import (
	"os"
	"strings"
	"testing"
)

// The README's quick start is this example's code between the quickstart
// markers, word for word: what a reader copies is what CI runs.
func TestReadmeQuickStartIsThisExample(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "// quickstart:begin\n")
	region, _, ok2 := strings.Cut(rest, "// quickstart:end")
	if !ok || !ok2 {
		t.Fatal("main.go has no quickstart:begin and quickstart:end markers")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "<!-- quickstart:")
	if !ok {
		t.Fatal("README.md has no <!-- quickstart: ... --> marker before its quick start")
	}
	_, block, ok := strings.Cut(after, "```go\n")
	block, _, ok2 = strings.Cut(block, "\n```")
	if !ok || !ok2 {
		t.Fatal("no go code block after README.md's quickstart marker")
	}
	if strings.TrimSpace(block) != strings.TrimSpace(region) {
		t.Fatalf("README.md's quick start differs from _examples/quickstart/main.go's region: copy the region into the README.\nREADME:\n%s\n\nmain.go:\n%s", block, region)
	}
}

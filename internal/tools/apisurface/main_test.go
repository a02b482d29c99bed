package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A synthetic module: what is counted in its public packages, and what is
// left out (internal, cmd, _examples, testdata, another module, tests,
// commands, files for another platform, unexported names and receivers).
func TestCountCountsWhatTheDocSays(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("root.go", `package m

import "io"

type Config struct {
	Name, Other string
	hidden      int
	io.Reader
	*Inner
	inner
	Nested struct{ Deep int }
}

type Inner struct{}
type inner struct{ Visible int }

func (c *Config) Run() {}
func (Config) stop()   {}
func (inner) Run()     {}

type List[T any] []T

func (l List[T]) Len() int { return len(l) }

type Alias = Config

type Doer interface {
	Do()
	undo()
	io.Closer
}

func New() *Config { return nil }
func helper()      {}

const (
	A, b = 1, 2
	C    = 3
)

var V, _ = 1, 2
var w int
`)
	write("root_test.go", "package m\n\nfunc Exported() {}\n")
	write("export_test.go", "package m\n\nvar Hidden = helper\n")
	write("other_windows.go", "package m\n\nfunc OnlyOnWindows() {}\n")
	write("sub/sub.go", "package sub\n\nfunc F() {}\n")
	write("internal/x/x.go", "package x\n\nfunc F() {}\n")
	write("cmd/tool/main.go", "package main\n\nfunc F() {}\n")
	write("sub/cmd/c.go", "package c\n\nfunc F() {}\n")
	write("_examples/e/e.go", "package e\n\nfunc F() {}\n")
	write("testdata/t.go", "package t\n\nfunc F() {}\n")
	write("nested/go.mod", "module example.com/nested\n")
	write("nested/n.go", "package nested\n\nfunc F() {}\n")
	write("app/main.go", "package main\n\nfunc F() {}\n")
	write("tests/only_test.go", "package tests\n\nfunc F() {}\n")

	ids, err := count(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, id := range ids {
		got = append(got, id.pkg+" "+id.name+" "+id.kind)
	}
	want := []string{
		"example.com/m A consts",
		"example.com/m Alias types",
		"example.com/m C consts",
		"example.com/m Config types",
		"example.com/m Config.Inner fields",
		"example.com/m Config.Name fields",
		"example.com/m Config.Nested fields",
		"example.com/m Config.Other fields",
		"example.com/m Config.Reader fields",
		"example.com/m Config.Run methods",
		"example.com/m Doer types",
		"example.com/m Doer.Do iface methods",
		"example.com/m Inner types",
		"example.com/m List types",
		"example.com/m List.Len methods",
		"example.com/m New funcs",
		"example.com/m V vars",
		"example.com/m/sub F funcs",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("counted:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	tab := table(ids)
	for _, row := range []string{
		"| package | types | funcs | methods | fields | iface methods | consts | vars | total | without fields |",
		"| example.com/m | 5 | 1 | 2 | 5 | 1 | 2 | 1 | 17 | 12 |",
		"| example.com/m/sub | 0 | 1 | 0 | 0 | 0 | 0 | 0 | 1 | 1 |",
		"| **total** | 5 | 2 | 2 | 5 | 1 | 2 | 1 | **18** | **13** |",
	} {
		if !strings.Contains(tab, row+"\n") {
			t.Errorf("the table lacks %q:\n%s", row, tab)
		}
	}
}

package consumer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// A Worker's state is changed in one place: where it stands (progress:
// the cursor, the attempt ledger, the suspects) is written only by the
// methods of progress.go and the ledger's own methods (ledger.go). A
// reviewer reads every way the cursor or an attempt count can change in
// those two files. This test reads the package's source and fails on a
// write anywhere else: an assignment or ++/-- to one of those fields or a
// part of one.
func TestTheWorkersProgressIsWrittenOnlyInProgressAndLedger(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	parsed := map[string]*ast.File{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = f
	}

	// The fields of progress, and the ledger's methods that change it.
	owned := map[string]bool{"progress": true}
	for _, d := range parsed["progress.go"].Decls {
		if g, ok := d.(*ast.GenDecl); ok {
			for _, spec := range g.Specs {
				if ts, ok := spec.(*ast.TypeSpec); ok && ts.Name.Name == "progress" {
					for _, field := range ts.Type.(*ast.StructType).Fields.List {
						for _, n := range field.Names {
							owned[n.Name] = true
						}
					}
				}
			}
		}
	}
	for _, want := range []string{"cursor", "ledger", "suspects"} {
		if !owned[want] {
			t.Fatalf("progress has no field %q: this test no longer checks what it says", want)
		}
	}
	// touches reports whether expression e (an assignment's target) is, or
	// is a part of, an owned field reached through a selector.
	touches := func(e ast.Expr) bool {
		for {
			switch x := e.(type) {
			case *ast.SelectorExpr:
				if owned[x.Sel.Name] {
					return true
				}
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.StarExpr:
				e = x.X
			case *ast.ParenExpr:
				e = x.X
			default:
				return false
			}
		}
	}
	checked := 0
	for name, f := range parsed {
		if name == "progress.go" || name == "ledger.go" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var targets []ast.Expr
			switch s := n.(type) {
			case *ast.AssignStmt:
				targets = s.Lhs
			case *ast.IncDecStmt:
				targets = []ast.Expr{s.X}
			}
			for _, e := range targets {
				checked++
				if touches(e) {
					t.Errorf("%s: writes the worker's progress (%s): only progress.go and ledger.go may", fset.Position(e.Pos()), exprString(e))
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no assignment found in the package: the test reads nothing")
	}
}

// exprString renders a selector chain for a message.
func exprString(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		return exprString(x.X) + "." + x.Sel.Name
	case *ast.Ident:
		return x.Name
	case *ast.IndexExpr:
		return exprString(x.X) + "[…]"
	case *ast.StarExpr:
		return "*" + exprString(x.X)
	case *ast.ParenExpr:
		return "(" + exprString(x.X) + ")"
	}
	return "…"
}

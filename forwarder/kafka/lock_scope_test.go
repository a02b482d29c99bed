package kafka

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The forwarder ↔ target contract takes no lock in one function and
// releases it in another (issue 41): in this package's source every
// function (or function literal) that locks a mutex also unlocks it, and
// none unlocks what it did not lock. A producer is held for a send by
// withProducer, and the lead of the transactional producer's rounds —
// which passes between goroutines — is taken and given back in rounds.go
// only. This test reads the source and fails on either pattern coming
// back.
func TestNoLockOutlivesTheFunctionThatTookIt(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		check := func(body *ast.BlockStmt, where token.Pos) {
			locks, unlocks := map[string]int{}, map[string]int{}
			ast.Inspect(body, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok && n.Pos() != body.Pos() {
					return false // checked on its own
				}
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "Lock", "TryLock", "RLock":
					locks[render(sel.X)]++
				case "Unlock", "RUnlock":
					unlocks[render(sel.X)]++
				}
				return true
			})
			for m := range locks {
				checked++
				if unlocks[m] == 0 {
					t.Errorf("%s: locks %s and never unlocks it in the same function", fset.Position(where), m)
				}
			}
			for m := range unlocks {
				if locks[m] == 0 {
					t.Errorf("%s: unlocks %s, which it did not lock", fset.Position(where), m)
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch fn := n.(type) {
			case *ast.FuncDecl:
				if fn.Body != nil {
					check(fn.Body, fn.Pos())
				}
			case *ast.FuncLit:
				check(fn.Body, fn.Pos())
			}
			return true
		})
		// The lead of the rounds changes hands only in rounds.go.
		if name != "rounds.go" {
			ast.Inspect(f, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok {
					for _, lhs := range as.Lhs {
						if sel, ok := lhs.(*ast.SelectorExpr); ok && (sel.Sel.Name == "leading" || sel.Sel.Name == "queue") {
							t.Errorf("%s: changes the rounds' %s outside rounds.go", fset.Position(as.Pos()), sel.Sel.Name)
						}
					}
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no lock found in the package: the test reads nothing")
	}
}

// render prints a selector chain (t.mu, p.mu, r.mu) for a message.
func render(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.SelectorExpr:
		return render(x.X) + "." + x.Sel.Name
	case *ast.Ident:
		return x.Name
	case *ast.CallExpr:
		return render(x.Fun) + "()"
	}
	return "?"
}

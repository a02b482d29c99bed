package apicheck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestNoInternalTypeInTheAPI parses the library packages and fails on an
// exported name whose type a user cannot read in go doc: an exported alias
// of a type of an internal package (type RejectedMessage =
// consumer.RejectedMessage showed no fields), and an internal package's
// type in the signature of an exported function or method, or in an
// exported field or method of an exported type. The types a user handles
// live in public packages (outboxtype, the leaf, for those every package
// shares).
func TestNoInternalTypeInTheAPI(t *testing.T) {
	var found []string
	for _, dir := range append(slices.Clone(libraryPackages), "pgtemp") {
		found = append(found, internalTypesIn(t, filepath.Join("..", "..", dir))...)
	}
	if len(found) > 0 {
		t.Errorf("exported API that names a type of an internal package (give it a public type: outboxtype for the shared ones):\n  %s", strings.Join(found, "\n  "))
	}
}

// internalTypesIn returns, for the package in dir (its non-test files),
// each exported declaration that names a type of an internal package.
func internalTypesIn(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	dirEntries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, de := range dirEntries {
		if de.IsDir() || !strings.HasSuffix(de.Name(), ".go") || strings.HasSuffix(de.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, de.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var out []string
	for _, f := range files {
		{
			internal := map[string]string{} // local name → import path, for internal imports
			for _, im := range f.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				if !strings.Contains(path, "/internal/") {
					continue
				}
				name := filepath.Base(path)
				if im.Name != nil {
					name = im.Name.Name
				}
				internal[name] = path
			}
			// names reports the internal types expr names.
			names := func(expr ast.Node) []string {
				var got []string
				ast.Inspect(expr, func(n ast.Node) bool {
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" {
							got = append(got, internal[id.Name]+"."+sel.Sel.Name)
						}
					}
					return true
				})
				return got
			}
			report := func(what string, expr ast.Node) {
				for _, n := range names(expr) {
					out = append(out, fset.Position(expr.Pos()).String()+": "+f.Name.Name+"."+what+" names "+n)
				}
			}
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					name := d.Name.Name
					if d.Recv != nil {
						recv := receiverType(d.Recv.List[0].Type)
						if !ast.IsExported(recv) {
							continue
						}
						name = recv + "." + name
					}
					report(name, d.Type)
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						ts, ok := spec.(*ast.TypeSpec)
						if !ok || !ts.Name.IsExported() {
							continue
						}
						switch typ := ts.Type.(type) {
						case *ast.StructType:
							for _, field := range typ.Fields.List {
								for _, fn := range field.Names {
									if fn.IsExported() {
										report(ts.Name.Name+"."+fn.Name, field.Type)
									}
								}
								if len(field.Names) == 0 { // embedded
									report(ts.Name.Name+" (embedded)", field.Type)
								}
							}
						case *ast.InterfaceType:
							for _, m := range typ.Methods.List {
								report(ts.Name.Name+" (method)", m.Type)
							}
						default:
							report(ts.Name.Name, ts.Type)
						}
					}
				}
			}
		}
	}
	return out
}

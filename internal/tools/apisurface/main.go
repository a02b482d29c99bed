// Command apisurface counts the exported identifiers of a Go module's public
// packages, so that the API's size can be compared across commits
// (scripts/exported-surface runs it, on the work tree or on a commit).
//
// A public package is a directory of the module (the one whose go.mod is in
// the directory given, "." by default) holding non-test Go files of a
// package other than main, except under a directory named internal,
// testdata or cmd, one whose name begins with "_" or ".", or a directory
// with a go.mod of its own (another module). The files are those go/build
// selects for the running platform, without tests (_test.go files, hence
// export_test.go too, are never counted).
//
// Counted, in each package, from its declarations at top level:
//
//   - types: each exported type name, aliases and generic types included;
//   - funcs: each exported function (no receiver);
//   - methods: each exported method whose receiver's type name is exported;
//   - fields: each exported field of an exported struct type (its own
//     fields only, not those of a nested struct literal nor those promoted
//     from an embedded type); an embedded field counts when its type's
//     name is exported;
//   - iface methods: each exported method declared in an exported
//     interface type (embedded interfaces and type-set terms are not
//     counted);
//   - consts and vars: each exported name declared.
//
// Not counted: methods of unexported types (even where reachable through
// an exported interface or embedding), promoted fields and methods,
// anything declared inside a function, and generic type parameters.
//
// The table's last column leaves the fields out: issue 41's figures for
// River with rivertype (316, at v0.51.2) and watermill-sql (173, v4.1.5)
// are that count.
//
// Usage:
//
//	apisurface [-names] [dir]
//
// prints a Markdown table with one row per package and a total (with and
// without the fields); -names
// prints instead every counted identifier, one a line ("path Name kind"),
// sorted, for a diff.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Kinds of identifier, in the table's column order.
var kinds = []string{"types", "funcs", "methods", "fields", "iface methods", "consts", "vars"}

// ident is one counted identifier.
type ident struct {
	pkg  string // import path
	name string // Name, Type.Method or Type.Field
	kind string // one of kinds
}

func main() {
	names := flag.Bool("names", false, "list every counted identifier instead of the table")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: apisurface [-names] [module dir]")
		flag.PrintDefaults()
	}
	flag.Parse()
	dir := "."
	switch flag.NArg() {
	case 0:
	case 1:
		dir = flag.Arg(0)
	default:
		flag.Usage()
		os.Exit(2)
	}
	ids, err := count(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apisurface:", err)
		os.Exit(1)
	}
	if *names {
		for _, id := range ids {
			fmt.Printf("%s %s %s\n", id.pkg, id.name, id.kind)
		}
		return
	}
	fmt.Print(table(ids))
}

// count returns the identifiers counted in the public packages of the
// module rooted at dir, sorted by package, then name.
func count(dir string) ([]ident, error) {
	module, err := modulePath(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	var ids []ident
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != dir {
			base := d.Name()
			if base == "internal" || base == "testdata" || base == "cmd" || strings.HasPrefix(base, "_") || strings.HasPrefix(base, ".") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		importPath := module
		if rel != "." {
			importPath = path.Join(module, filepath.ToSlash(rel))
		}
		got, err := packageIdents(p, importPath)
		if err != nil {
			return err
		}
		ids = append(ids, got...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].pkg != ids[j].pkg {
			return ids[i].pkg < ids[j].pkg
		}
		if ids[i].name != ids[j].name {
			return ids[i].name < ids[j].name
		}
		return ids[i].kind < ids[j].kind
	})
	return ids, nil
}

// modulePath reads the module path from the go.mod file at p.
func modulePath(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module line", p)
}

// packageIdents returns the identifiers counted in the package in dir, or
// none when dir holds no non-test Go files or a command.
func packageIdents(dir, importPath string) ([]ident, error) {
	bp, err := build.Default.ImportDir(dir, 0)
	if err != nil {
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			return nil, nil
		}
		return nil, err
	}
	if bp.Name == "main" {
		return nil, nil
	}
	fset := token.NewFileSet()
	var ids []ident
	add := func(name, kind string) { ids = append(ids, ident{pkg: importPath, name: name, kind: kind}) }
	for _, name := range append(append([]string(nil), bp.GoFiles...), bp.CgoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					add(d.Name.Name, "funcs")
					continue
				}
				if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
					add(recv+"."+d.Name.Name, "methods")
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						add(s.Name.Name, "types")
						switch t := s.Type.(type) {
						case *ast.StructType:
							for _, field := range t.Fields.List {
								if len(field.Names) == 0 {
									if n := embeddedName(field.Type); ast.IsExported(n) {
										add(s.Name.Name+"."+n, "fields")
									}
								}
								for _, fn := range field.Names {
									if fn.IsExported() {
										add(s.Name.Name+"."+fn.Name, "fields")
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range t.Methods.List {
								for _, mn := range m.Names { // none for an embedded interface or a type set
									if mn.IsExported() {
										add(s.Name.Name+"."+mn.Name, "iface methods")
									}
								}
							}
						}
					case *ast.ValueSpec:
						kind := "vars"
						if d.Tok == token.CONST {
							kind = "consts"
						}
						for _, n := range s.Names {
							if n.IsExported() {
								add(n.Name, kind)
							}
						}
					}
				}
			}
		}
	}
	return ids, nil
}

// receiverType returns the name of a method receiver's type: T for T, *T,
// T[K] and *T[K].
func receiverType(expr ast.Expr) string {
	for {
		switch e := expr.(type) {
		case *ast.StarExpr:
			expr = e.X
		case *ast.IndexExpr:
			expr = e.X
		case *ast.IndexListExpr:
			expr = e.X
		case *ast.ParenExpr:
			expr = e.X
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}

// embeddedName returns the field name an embedded field's type gives it:
// T for T, *T, pkg.T and their generic instances.
func embeddedName(expr ast.Expr) string {
	for {
		switch e := expr.(type) {
		case *ast.StarExpr:
			expr = e.X
		case *ast.IndexExpr:
			expr = e.X
		case *ast.IndexListExpr:
			expr = e.X
		case *ast.SelectorExpr:
			return e.Sel.Name
		case *ast.Ident:
			return e.Name
		default:
			return ""
		}
	}
}

// table renders ids as a Markdown table: one row per package, in import
// path order, with a count per kind, the package's total and its total
// without the fields, and a last row of the totals.
func table(ids []ident) string {
	w := &strings.Builder{}
	perPkg := map[string]map[string]int{}
	var pkgs []string
	for _, id := range ids {
		if perPkg[id.pkg] == nil {
			perPkg[id.pkg] = map[string]int{}
			pkgs = append(pkgs, id.pkg)
		}
		perPkg[id.pkg][id.kind]++
	}
	sort.Strings(pkgs)
	fmt.Fprintf(w, "| package | %s | total | without fields |\n", strings.Join(kinds, " | "))
	fmt.Fprintf(w, "|---|%s---:|---:|\n", strings.Repeat("---:|", len(kinds)))
	sum := map[string]int{}
	all := 0
	for _, p := range pkgs {
		fmt.Fprintf(w, "| %s |", p)
		n := 0
		for _, k := range kinds {
			fmt.Fprintf(w, " %d |", perPkg[p][k])
			n += perPkg[p][k]
			sum[k] += perPkg[p][k]
		}
		fmt.Fprintf(w, " %d | %d |\n", n, n-perPkg[p]["fields"])
		all += n
	}
	fmt.Fprint(w, "| **total** |")
	for _, k := range kinds {
		fmt.Fprintf(w, " %d |", sum[k])
	}
	fmt.Fprintf(w, " **%d** | **%d** |\n", all, all-sum["fields"])
	return w.String()
}

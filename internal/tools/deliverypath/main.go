// Command deliverypath measures how far a reader travels to follow one
// delivery through the delivery core (issue 41): the functions of package
// internal/consumer that one delivery runs, in the order a reader meets
// them starting from Worker.scan, the files they are in, and how often the
// reader comes back to a file already left.
//
// What runs is measured, not guessed: the tool runs one unit test of the
// package (-run, by default TestOneDelivery: one message read, handed
// out, acked and its cursor moved, by the Leased strategy, and nothing
// else) with coverage, and keeps the functions that ran. The order
// is the source's: from Worker.scan, depth first, each call (or method
// value) in a function's body in source order, into a function of the
// package that ran and was not met before. Calls are matched by name (a
// method name matches every method of that name: both scopes' commit, for
// instance), which is enough in one package. A step is a function met; a
// return to a file already left is a move, on entering a function or on
// coming back from one, into a file the reader was in before and left.
//
//	go run ./internal/tools/deliverypath [-pkg ./internal/consumer] [-run TestName] [-v]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	pkg := flag.String("pkg", "./internal/consumer", "the package directory")
	run := flag.String("run", "^TestOneDelivery$", "the test whose run is followed")
	start := flag.String("from", "scan", "the method the path starts at")
	verbose := flag.Bool("v", false, "print the path")
	flag.Parse()
	if err := measure(*pkg, *run, *start, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "deliverypath:", err)
		os.Exit(1)
	}
}

// fn is one function or method of the package.
type fn struct {
	name string // "Recv.name" or "name"
	file string
	decl *ast.FuncDecl
	ran  bool
}

func measure(dir, run, start string, verbose bool) error {
	profile, err := os.CreateTemp("", "deliverypath-*.cover")
	if err != nil {
		return err
	}
	profile.Close()
	defer os.Remove(profile.Name())
	cmd := exec.Command("go", "test", dir, "-run", run, "-count=1", "-covermode=set", "-coverprofile="+profile.Name())
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("go test: %v\n%s", err, out)
	}
	covered, err := readProfile(profile.Name())
	if err != nil {
		return err
	}

	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	var parsed []*ast.File
	for _, path := range names {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		parsed = append(parsed, f)
	}
	// Types resolve each call to the function it calls: a field and a
	// method of one name, or methods of one name on two types, are told
	// apart.
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(error) {}}
	if _, err := conf.Check(parsed[0].Name.Name, fset, parsed, info); err != nil {
		return fmt.Errorf("type-check %s: %w", dir, err)
	}
	byObj := map[types.Object]*fn{}
	var root *fn
	for _, f := range parsed {
		base := filepath.Base(fset.Position(f.Pos()).Filename)
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			x := &fn{name: fd.Name.Name, file: base, decl: fd}
			if fd.Recv != nil {
				x.name = recvName(fd.Recv.List[0].Type) + "." + fd.Name.Name
			}
			from, to := fset.Position(fd.Body.Pos()).Line, fset.Position(fd.Body.End()).Line
			for _, line := range covered[base] {
				if line >= from && line <= to {
					x.ran = true
					break
				}
			}
			byObj[info.Defs[fd.Name]] = x
			if x.name == "Worker."+start {
				root = x
			}
		}
	}
	if root == nil || !root.ran {
		return fmt.Errorf("method Worker.%s not found, or it did not run in %s", start, run)
	}

	// callees is what a use of obj may run: the function itself, or, for
	// a method of an interface of the package, the package's methods that
	// implement it, by their types' names.
	callees := func(obj types.Object) []*fn {
		if c := byObj[obj]; c != nil {
			return []*fn{c}
		}
		m, ok := obj.(*types.Func)
		if !ok || m.Pkg() == nil || m.Pkg().Path() != parsed[0].Name.Name {
			return nil
		}
		iface, ok := m.Type().(*types.Signature).Recv().Type().Underlying().(*types.Interface)
		if !ok {
			return nil
		}
		var out []*fn
		for o, c := range byObj {
			f, ok := o.(*types.Func)
			if !ok || f.Name() != m.Name() {
				continue
			}
			recv := f.Type().(*types.Signature).Recv()
			if recv != nil && (types.Implements(recv.Type(), iface) || types.Implements(types.NewPointer(recv.Type()), iface)) {
				out = append(out, c)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
		return out
	}

	var (
		steps   []string
		files   []string // the reader's file, at each move
		seen    = map[*fn]bool{}
		visited = map[string]bool{}
		returns int
	)
	move := func(file string) {
		if len(files) > 0 && files[len(files)-1] == file {
			return
		}
		if visited[file] {
			returns++
		}
		visited[file] = true
		files = append(files, file)
	}
	var visit func(x *fn, depth int)
	visit = func(x *fn, depth int) {
		seen[x] = true
		steps = append(steps, fmt.Sprintf("%s%s (%s:%d)", strings.Repeat("  ", depth), x.name, x.file, fset.Position(x.decl.Pos()).Line))
		move(x.file)
		ast.Inspect(x.decl.Body, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			for _, c := range callees(info.Uses[id]) {
				if c.ran && !seen[c] {
					visit(c, depth+1)
					move(x.file)
				}
			}
			return true
		})
	}
	visit(root, 0)

	distinct := map[string]bool{}
	for _, f := range files {
		distinct[f] = true
	}
	if verbose {
		for _, s := range steps {
			fmt.Println(s)
		}
		fmt.Println()
	}
	fmt.Printf("one delivery (%s) from Worker.%s: %d steps through %d files, %d returns to a file already left\n",
		run, start, len(steps), len(distinct), returns)
	return nil
}

// recvName is the type name of a method's receiver.
func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return recvName(t.X)
	}
	return "?"
}

// readProfile returns, per file base name, the first line of every block
// the run covered.
func readProfile(path string) (map[string][]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		// import/path/file.go:12.34,15.2 3 1
		colon := strings.LastIndex(line, ":")
		fields := strings.Fields(line[colon+1:])
		if colon < 0 || len(fields) != 3 || fields[2] == "0" {
			continue
		}
		startLine, err := strconv.Atoi(strings.SplitN(fields[0], ".", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("profile line %q: %v", line, err)
		}
		base := filepath.Base(line[:colon])
		out[base] = append(out[base], startLine)
	}
	return out, sc.Err()
}

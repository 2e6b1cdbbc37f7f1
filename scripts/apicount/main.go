// Command apicount counts the exported identifiers of the module's public
// packages (every package outside internal/, cmd/, scripts/, examples/,
// deploy/ and bench/), over non-test files, and fails when a count exceeds
// its bound.
//
// An exported identifier is an exported top-level func, type, var or const,
// an exported method, an exported field of an exported struct type and an
// exported method of an exported interface type.
//
//	go run ./scripts/apicount -max 560 -max-root 70
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

var withFields = flag.Bool("fields", false, "also count exported struct fields and interface methods")

func main() {
	maxAll := flag.Int("max", 0, "fail when the public packages export more than this many identifiers (0: no bound)")
	maxRoot := flag.Int("max-root", 0, "fail when the root package exports more than this many identifiers (0: no bound)")
	verbose := flag.Bool("v", false, "print the count of every package")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	counts, err := count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	total := 0
	dirs := make([]string, 0, len(counts))
	for d, n := range counts {
		total += n
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	if *verbose {
		for _, d := range dirs {
			fmt.Printf("%5d %s\n", counts[d], d)
		}
	}
	fmt.Printf("apicount: %d exported identifiers in %d public packages (bound %d); %d in the root package (bound %d)\n",
		total, len(dirs), *maxAll, counts["."], *maxRoot)
	failed := false
	if *maxAll > 0 && total > *maxAll {
		fmt.Fprintf(os.Stderr, "apicount: %d exported identifiers, more than %d\n", total, *maxAll)
		failed = true
	}
	if *maxRoot > 0 && counts["."] > *maxRoot {
		fmt.Fprintf(os.Stderr, "apicount: the root package exports %d identifiers, more than %d\n", counts["."], *maxRoot)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

// private reports whether a directory, relative to the module root, holds no
// public package.
func private(rel string) bool {
	for _, part := range strings.Split(filepath.ToSlash(rel), "/") {
		switch part {
		case "internal", "testdata", "cmd", "scripts", "examples", "deploy", "bench", "docs":
			return true
		}
		if strings.HasPrefix(part, ".") && part != "." {
			return true
		}
	}
	return false
}

func count(root string) (map[string]int, error) {
	counts := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if private(rel) {
			return filepath.SkipDir
		}
		if rel != "." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(path, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" {
				continue
			}
			counts[rel] += exported(f)
		}
		return nil
	})
	return counts, err
}

// exported counts a file's exported identifiers.
func exported(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if !decl.Name.IsExported() {
				continue
			}
			if decl.Recv != nil && !receiverExported(decl.Recv) {
				continue
			}
			n++
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					for _, name := range spec.Names {
						if name.IsExported() {
							n++
						}
					}
				case *ast.TypeSpec:
					if !spec.Name.IsExported() {
						continue
					}
					n++
					if *withFields {
						n += members(spec.Type)
					}
				}
			}
		}
	}
	return n
}

// members counts the exported fields of a struct type and the exported
// methods of an interface type.
func members(t ast.Expr) int {
	var list *ast.FieldList
	switch t := t.(type) {
	case *ast.StructType:
		list = t.Fields
	case *ast.InterfaceType:
		list = t.Methods
	default:
		return 0
	}
	n := 0
	for _, field := range list.List {
		for _, name := range field.Names {
			if name.IsExported() {
				n++
			}
		}
	}
	return n
}

func receiverExported(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

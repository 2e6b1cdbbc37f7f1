package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/server"
)

// TestReadmeFirstCommands holds the README's first two commands to what
// they do: `go run ./cmd/weir serve` with no flag serves the dashboard on
// :8080 (the address its comment gives) on the in-memory store with the
// built-in demo rules, and `make test` is a target of the Makefile whose
// dependency step is the one the comment describes.
func TestReadmeFirstCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	lines := strings.Split(strings.TrimSpace(block), "\n")
	if !ok || len(lines) < 2 {
		t.Fatalf("README.md starts with no sh block of two commands: %q", block)
	}
	cmd, comment, _ := strings.Cut(lines[0], "#")
	if f := strings.Fields(cmd); strings.Join(f, " ") != "go run ./cmd/weir serve" {
		t.Fatalf("the README's first command is %q; this test knows `go run ./cmd/weir serve`", cmd)
	}
	if !strings.Contains(comment, "in-memory store") || !strings.Contains(comment, "http://localhost:8080") {
		t.Errorf("the first command's comment %q does not name the store and the dashboard's address", comment)
	}
	f, log, code := parseServeArgs(nil, io.Discard, io.Discard, func(string) (string, bool) { return "", false })
	if f == nil {
		t.Fatalf("weir serve with no flag: exit %d", code)
	}
	srv, err := server.New(serverOptions(f, log, func(string) (string, bool) { return "", false })...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if got := srv.HTTPAddr(); got != ":8080" {
		t.Errorf("weir serve with no flag listens on %q; the README says :8080", got)
	}
	if got := srv.StoreDescription(); got != "memory" {
		t.Errorf("weir serve with no flag uses the store %q; the README says in-memory", got)
	}
	if got := srv.RulesSource(); got != "built-in demo" {
		t.Errorf("weir serve with no flag runs the rules of %q; the demo needs the built-in demo rules", got)
	}

	cmd, comment, _ = strings.Cut(lines[1], "#")
	if strings.TrimSpace(cmd) != "make test" {
		t.Fatalf("the README's second command is %q; this test knows `make test`", cmd)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	target := regexp.MustCompile(`(?m)^test:(.*)$`).FindSubmatch(mk)
	if target == nil || !strings.Contains(string(target[1]), "deps") {
		t.Fatalf("the Makefile has no test target that runs deps: %q", target)
	}
	deps, err := os.ReadFile("../../scripts/deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(comment, "Debian") || !strings.Contains(comment, "elsewhere it names") ||
		!strings.Contains(string(deps), "apt-get") || !strings.Contains(string(deps), "install them with your package manager") {
		t.Errorf("make test's comment %q and scripts/deps.sh disagree: deps.sh installs with apt-get and names what is missing elsewhere", comment)
	}
}

// readmeSession returns the README's sh block that starts with first: the
// commands (lines starting "$ ") and the output each printed.
func readmeSession(t *testing.T, first string) (cmds []string, outs [][]string) {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```sh\n"+first)
	if !ok {
		t.Fatalf("README.md has no sh block starting %q", first)
	}
	block, _, _ = strings.Cut(first+block, "```")
	for line := range strings.Lines(block) {
		line = strings.TrimSuffix(line, "\n")
		if c, ok := strings.CutPrefix(line, "$ "); ok {
			cmds = append(cmds, c)
			outs = append(outs, nil)
		} else if len(outs) > 0 {
			outs[len(outs)-1] = append(outs[len(outs)-1], line)
		}
	}
	return cmds, outs
}

// TestReadmeValidateExample: the README's weir validate example prints
// what weir validate prints for its file, the field list included.
func TestReadmeValidateExample(t *testing.T) {
	cmds, outs := readmeSession(t, "$ cat bad.yaml\n")
	if len(cmds) != 2 || cmds[1] != "go run ./cmd/weir validate bad.yaml" {
		t.Fatalf("the README's validate example runs %q", cmds)
	}
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/bad.yaml", []byte(strings.Join(outs[0], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	out, errs, code := runCLI(t, "validate", "bad.yaml")
	if got, want := strings.TrimSpace(out+errs), strings.Join(outs[1], "\n"); code != 1 || got != want {
		t.Errorf("weir validate bad.yaml: exit %d\n%s\nthe README shows:\n%s", code, got, want)
	}
}

// TestReadmeReplayExample: the README's weir replay example shows the
// table weir replay prints for the example log, and the limit --suggest
// prints.
func TestReadmeReplayExample(t *testing.T) {
	cmds, outs := readmeSession(t, "$ go run ./cmd/weir replay ")
	if len(cmds) != 2 {
		t.Fatalf("the README's replay example runs %q", cmds)
	}
	t.Chdir("../..")
	for i, c := range cmds {
		args := strings.Fields(strings.TrimPrefix(c, "go run ./cmd/weir "))
		out, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("weir %s: exit %d: %s", c, code, errs)
		}
		for _, line := range outs[i] {
			if line != "..." && !strings.Contains(out, line+"\n") {
				t.Errorf("weir %s prints no line %q:\n%s", c, line, out)
			}
		}
	}
}

// TestReadmeEndpointTable: the README's table of endpoints names every
// route of the API reference.
func TestReadmeEndpointTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "| endpoint | what it does |")
	table, _, _ = strings.Cut(table, "\n\n")
	var doc struct{ Paths map[string]any }
	if err := json.Unmarshal(server.OpenAPI(), &doc); err != nil || !ok {
		t.Fatalf("openapi.json: %v; README's table found: %v", err, ok)
	}
	for path := range doc.Paths {
		if !regexp.MustCompile("[ `,/]" + regexp.QuoteMeta(path) + "[`, ]").MatchString(table) {
			t.Errorf("the README's endpoint table does not name %s", path)
		}
	}
}

// TestDocsShowErrorsAndReferenceExamples: the README and docs/ never
// show redisstore.New without taking its error, and every config file
// directly under examples/ is referenced from them.
func TestDocsShowErrorsAndReferenceExamples(t *testing.T) {
	docs, _ := filepath.Glob("../../docs/*.md")
	var all strings.Builder
	for _, p := range append(docs, "../../README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "redisstore.New(") && !strings.Contains(line, "err :=") && !strings.Contains(line, "err =") {
				t.Errorf("%s:%d shows redisstore.New without its error: %s", filepath.Base(p), i+1, strings.TrimSpace(line))
			}
		}
	}
	examples, _ := filepath.Glob("../../examples/*.yaml")
	if len(examples) == 0 {
		t.Fatal("no examples/*.yaml")
	}
	for _, p := range examples {
		name := "examples/" + filepath.Base(p)
		if !strings.Contains(all.String(), name) {
			t.Errorf("%s is referenced from neither README.md nor docs/", name)
		}
	}
}

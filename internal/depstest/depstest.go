// Package depstest checks in tests which packages a package links, with
// go list -deps.
package depstest

import (
	"os/exec"
	"strings"
	"testing"
)

// YAML, among Forbid's forbidden paths, forbids every package whose path
// mentions YAML.
const YAML = "yaml"

// Deps returns the packages outside the standard library that pkg (an
// import path, or "." for the test's own package) depends on, pkg
// included, built with tags (comma-separated; "" for none). It skips t
// under -short and when no go command is on the PATH, and fails t when go
// list fails or lists nothing.
func Deps(t testing.TB, pkg, tags string) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs go list")
	}
	// The go command on the PATH, which go test was run with (runtime.GOROOT
	// names the toolchain that built the test binary).
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-tags", tags, "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatalf("go list -deps %s listed nothing", pkg)
	}
	return deps
}

// Forbid fails t for each package of deps that is one of forbidden or
// inside one (under its path), and, when forbidden holds YAML, for each
// package whose path mentions YAML. name names the package deps are of.
func Forbid(t testing.TB, name string, deps []string, forbidden ...string) {
	t.Helper()
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") || f == YAML && strings.Contains(strings.ToLower(d), YAML) {
				t.Errorf("%s depends on %s", name, d)
			}
		}
	}
}

package depstest

import (
	"fmt"
	"slices"
	"testing"
)

// TestDeps: this package links nothing outside the standard library but
// itself, and Forbid catches a forbidden path, a package under it and a
// YAML package, and nothing else.
func TestDeps(t *testing.T) {
	const self = "github.com/weir-dev/weir/internal/depstest"
	if deps := Deps(t, self, ""); !slices.Equal(deps, []string{self}) {
		t.Fatalf("Deps(%s) = %q, want only itself", self, deps)
	}
	rec := &recorder{TB: t}
	Forbid(rec, "p", []string{"a/b", "a/bc", "a/b/c", "x/go-yaml", "ok"}, "a/b", YAML)
	if want := []string{"p depends on a/b", "p depends on a/b/c", "p depends on x/go-yaml"}; !slices.Equal(rec.errs, want) {
		t.Fatalf("Forbid reported %q, want %q", rec.errs, want)
	}
}

type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

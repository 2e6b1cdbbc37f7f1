package httplimit_test

import (
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestDependencies keeps httplimit light: a program that puts one limit in
// front of a handler does not link weir.yaml's parser, its file watcher or
// the memory store. Rules from weir.yaml come through policy.Middleware,
// which depends on httplimit, never the other way round. Package protect,
// which needs only the standard library, writes its rejection bodies
// (protect.WriteProblem): one shape for every weir rejection.
func TestDependencies(t *testing.T) {
	depstest.Forbid(t, "httplimit", depstest.Deps(t, "github.com/weir-dev/weir/httplimit", ""),
		"github.com/weir-dev/weir/policy",
		"google.golang.org/grpc",
		"github.com/weir-dev/weir/store/memstore",
		"github.com/fsnotify/fsnotify",
		depstest.YAML,
	)
}

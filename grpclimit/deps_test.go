package grpclimit_test

import (
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestDependencies keeps grpclimit light: a program that puts one limit in
// front of a gRPC server does not link weir.yaml's parser, its file
// watcher or the stores. Rules from weir.yaml come through grpcpolicy,
// which depends on grpclimit, never the other way round. Package protect
// (standard library only) comes in through httplimit: it writes every
// weir rejection body.
func TestDependencies(t *testing.T) {
	depstest.Forbid(t, "grpclimit", depstest.Deps(t, "github.com/weir-dev/weir/grpclimit", ""),
		"github.com/weir-dev/weir/policy",
		"github.com/weir-dev/weir/grpclimit/grpcpolicy",
		"github.com/weir-dev/weir/store",
		"github.com/fsnotify/fsnotify",
		depstest.YAML,
	)
}

package grpclimit_test

import (
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestDependencies keeps grpclimit light: a program that puts one limit in
// front of a gRPC server does not link weir.yaml's parser, its file
// watcher, the overload protection or the memory store. Rules from
// weir.yaml come through grpcpolicy, which depends on grpclimit, never the
// other way round.
func TestDependencies(t *testing.T) {
	depstest.Forbid(t, "grpclimit", depstest.Deps(t, "github.com/weir-dev/weir/grpclimit", ""),
		"github.com/weir-dev/weir/policy",
		"github.com/weir-dev/weir/grpclimit/grpcpolicy",
		"github.com/weir-dev/weir/protect",
		"github.com/weir-dev/weir/store",
		"github.com/fsnotify/fsnotify",
		depstest.YAML,
	)
}

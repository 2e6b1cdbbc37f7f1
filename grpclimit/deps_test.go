package grpclimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps grpclimit light: a program that puts one limit in
// front of a gRPC server does not link weir.yaml's parser, its file
// watcher, the overload protection or the memory store. Rules from
// weir.yaml come through grpcpolicy, which depends on grpclimit, never the
// other way round.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/weir-dev/weir/grpclimit").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/weir-dev/weir/policy",
		"github.com/weir-dev/weir/grpclimit/grpcpolicy",
		"github.com/weir-dev/weir/protect",
		"github.com/weir-dev/weir/store",
		"github.com/fsnotify/fsnotify",
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("grpclimit depends on %s", d)
			}
		}
		if strings.Contains(strings.ToLower(d), "yaml") {
			t.Errorf("grpclimit depends on a YAML package: %s", d)
		}
	}
}

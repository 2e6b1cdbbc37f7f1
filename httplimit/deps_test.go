package httplimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps httplimit light: a program that puts one limit in
// front of a handler does not link weir.yaml's parser, its file watcher or
// the memory store. Rules from weir.yaml come through policy.Middleware,
// which depends on httplimit, never the other way round. Package protect,
// which needs only the standard library, writes its rejection bodies
// (protect.WriteProblem): one shape for every weir rejection.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	// The go command on the PATH, which go test was run with (runtime.GOROOT
	// is deprecated: it names the toolchain that built the test binary).
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/weir-dev/weir/httplimit").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/weir-dev/weir/policy",
		"google.golang.org/grpc",
		"github.com/weir-dev/weir/store/memstore",
		"github.com/fsnotify/fsnotify",
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("httplimit depends on %s", d)
			}
		}
		if strings.Contains(strings.ToLower(d), "yaml") {
			t.Errorf("httplimit depends on a YAML package: %s", d)
		}
	}
}

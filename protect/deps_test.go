package protect_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies: package protect needs nothing beyond the standard
// library, so that a service can use its breakers and limits without
// weir's YAML, stores or metrics.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "github.com/weir-dev/weir/protect").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if d != "github.com/weir-dev/weir/protect" {
			t.Errorf("protect depends on %s", d)
		}
	}
}

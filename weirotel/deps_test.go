package weirotel_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies: weirotel depends on the OpenTelemetry API only. A
// program that wraps its store or instruments its checks links neither
// the SDK nor an exporter; it configures those itself (weir serve does in
// internal/otelsetup) and hands weirotel.New its tracer provider.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/weir-dev/weir/weirotel").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters",
		"go.opentelemetry.io/proto",
		"go.opentelemetry.io/auto/sdk",
		"github.com/weir-dev/weir/internal/otelsetup",
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	var api bool
	for _, d := range deps {
		api = api || d == "go.opentelemetry.io/otel/trace"
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("weirotel depends on %s", d)
			}
		}
	}
	if !api {
		t.Error("go.opentelemetry.io/otel/trace not among weirotel's dependencies: is the list right?")
	}
}

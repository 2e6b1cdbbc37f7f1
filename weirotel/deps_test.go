package weirotel_test

import (
	"slices"
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestDependencies: weirotel depends on the OpenTelemetry API only. A
// program that wraps its store or instruments its checks links neither
// the SDK nor an exporter; it configures those itself (weir serve does in
// internal/otelsetup) and hands weirotel.New its tracer provider.
func TestDependencies(t *testing.T) {
	deps := depstest.Deps(t, "github.com/weir-dev/weir/weirotel", "")
	depstest.Forbid(t, "weirotel", deps,
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters",
		"go.opentelemetry.io/proto",
		"go.opentelemetry.io/auto/sdk",
		"github.com/weir-dev/weir/internal/otelsetup",
	)
	if !slices.Contains(deps, "go.opentelemetry.io/otel/trace") {
		t.Error("go.opentelemetry.io/otel/trace not among weirotel's dependencies: is the list right?")
	}
}

package protect_test

import (
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestDependencies: package protect needs nothing beyond the standard
// library, so that a service can use its breakers and limits without
// weir's YAML, stores or metrics.
func TestDependencies(t *testing.T) {
	const self = "github.com/weir-dev/weir/protect"
	for _, d := range depstest.Deps(t, self, "") {
		if d != self {
			t.Errorf("protect depends on %s", d)
		}
	}
}

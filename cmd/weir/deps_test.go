package main

import (
	"slices"
	"testing"

	"github.com/weir-dev/weir/internal/depstest"
)

// TestNoHandWrittenHTTP2Client: the weir binary, built without the bench
// tag, does not carry weir bench's hand-written HTTP/2 client
// (internal/h2client); built with it, it does.
func TestNoHandWrittenHTTP2Client(t *testing.T) {
	const h2client = "github.com/weir-dev/weir/internal/h2client"
	for _, tags := range []string{"", "bench"} {
		deps := depstest.Deps(t, ".", tags)
		if !slices.Contains(deps, "github.com/weir-dev/weir/internal/server") {
			t.Fatalf("go list -deps -tags %q: weir's server not listed: is the list right?\n%s", tags, deps)
		}
		if got, want := slices.Contains(deps, h2client), tags == "bench"; got != want {
			t.Errorf("built with tags %q, weir links %s: %v, want %v", tags, h2client, got, want)
		}
	}
}

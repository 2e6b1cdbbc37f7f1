package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoHandWrittenHTTP2Client: the weir binary, built without the bench
// tag, does not carry weir bench's hand-written HTTP/2 client
// (internal/h2client); built with it, it does.
func TestNoHandWrittenHTTP2Client(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the PATH")
	}
	const h2client = "github.com/weir-dev/weir/internal/h2client"
	for _, tags := range []string{"", "bench"} {
		out, err := exec.Command(goTool, "list", "-deps", "-tags", tags, ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps -tags %q: %v\n%s", tags, err, out)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, "github.com/weir-dev/weir/internal/server") {
			t.Fatalf("go list -deps -tags %q: weir's server not listed: is the list right?\n%s", tags, out)
		}
		if got, want := slices.Contains(deps, h2client), tags == "bench"; got != want {
			t.Errorf("built with tags %q, weir links %s: %v, want %v", tags, h2client, got, want)
		}
	}
}

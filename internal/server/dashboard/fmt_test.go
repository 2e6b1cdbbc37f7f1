package dashboard

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCountedAgrees runs fmt.js's counted under Node, when there is one:
// the noun agrees with the count.
func TestCountedAgrees(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	mod, err := filepath.Abs("assets/fmt.js")
	if err != nil {
		t.Fatal(err)
	}
	script := `import * as f from ` + "'" + mod + "'" + `;
console.log([0, 1, 2].map((n) => f.counted(n, 'call', 'calls')).join('|'));`
	out, err := exec.Command(node, "--input-type=module", "-e", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "0 calls|1 call|2 calls" {
		t.Fatalf("counted: %q", got)
	}
}

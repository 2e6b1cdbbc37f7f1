package main

import (
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/policy"
)

// TestOverrideCommand drives weir override against a real weir serve
// handler: set, list, import (with a bad line, reported by number) and
// delete; a bad field comes back named.
func TestOverrideCommand(t *testing.T) {
	cfg, err := policy.Parse([]byte("rules:\n  - name: api\n    identity: [header:X-Key]\n    limit: 5/m\n    algorithm: fixed_window\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.WithConfig(cfg), server.WithAdminToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer func() { ts.Close(); s.Close() }()
	t.Setenv("WEIR_ADMIN_TOKEN", "tok")
	cmd := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"override"}, append(args, "--url", ts.URL)...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cmd("set", "--rule", "api", "--key", "acme", "--limit", "50/m", "--note", "deal"); code != 0 || !strings.Contains(out, `"limit":"50/m"`) {
		t.Fatalf("set: %d %s %s", code, out, errs)
	}
	if code, _, errs := cmd("set", "--rule", "api", "--key", "acme", "--limit", "50/h"); code != 1 || !strings.Contains(errs, "field limit") {
		t.Fatalf("set with another period: %d %s", code, errs)
	}
	file := filepath.Join(t.TempDir(), "overrides.jsonl")
	os.WriteFile(file, []byte(`# plan upgrades
{"rule":"api","key":"beta","limit":"10/m"}
{"rule":"api","key":"gamma","limit":"10/m","until":"2001-01-01T00:00:00Z"}
{"rule":"api","key":"team-*","limit":"20/m","note":"teams"}
`), 0o644)
	code, out, errs := cmd("import", file)
	if code != 1 || !strings.Contains(out, "2 set, 1 failed") || !strings.Contains(errs, "overrides.jsonl:3:") || !strings.Contains(errs, "field until") {
		t.Fatalf("import: %d %q %q", code, out, errs)
	}
	code, out, _ = cmd("list", "--rule", "api")
	if code != 0 || strings.Count(out, `"key"`) != 3 || !strings.Contains(out, `"team-*"`) {
		t.Fatalf("list: %d %s", code, out)
	}
	if code, out, _ := cmd("delete", "--rule", "api", "--key", "beta"); code != 0 || !strings.Contains(out, `"deleted":true`) {
		t.Fatalf("delete: %d %s", code, out)
	}
	if code, out, _ := cmd("list", "--rule", "api"); code != 0 || strings.Count(out, `"key"`) != 2 {
		t.Fatalf("list after delete: %d %s", code, out)
	}
	// The audit log: acme, beta, team-* set, beta deleted; the latest 2.
	if code, out, errs := cmd("audit", "--count", "2"); code != 0 || strings.Count(out, `"op"`) != 2 || !strings.Contains(out, `"key":"team-*"`) || !strings.Contains(out, `"op":"delete"`) {
		t.Fatalf("audit --count 2: %d %s %s", code, out, errs)
	}
	if code, _, errs := cmd("audit", "--since", "yesterday"); code != 1 || !strings.Contains(errs, "since") {
		t.Fatalf("audit --since yesterday: %d %s", code, errs)
	}
}

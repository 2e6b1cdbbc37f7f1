package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateEnvoy: weir validate --envoy DIR loads the directory as weir
// serve --envoy-config does and names the file and line of a problem.
func TestValidateEnvoy(t *testing.T) {
	good := t.TempDir()
	writeFile(t, good, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    value: x*y\n    share_threshold: true\n    metadata: {tier: gold}\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	writeFile(t, good, "b.yml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n")
	out, errs, code := runCLI(t, "validate", "--envoy", good)
	if code != 0 || out != good+": ok: 2 domains, 2 rules\n" || errs != "" {
		t.Fatalf("good: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	bad := t.TempDir()
	writeFile(t, bad, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	out, errs, code = runCLI(t, "validate", "--envoy", bad)
	if want := filepath.Join(bad, "a.yaml") + ":4: unknown unit \"fortnight\" (want second, minute, hour, day, week, month or year)\n"; code != 1 || out != "" || errs != want {
		t.Fatalf("bad: exit %d, stdout %q, stderr %q, want %q", code, out, errs, want)
	}

	dup := t.TempDir()
	writeFile(t, dup, "a.yaml", "domain: a\ndescriptors: []\n")
	writeFile(t, dup, "b.yaml", "\ndomain: a\n")
	if _, errs, code = runCLI(t, "validate", "--envoy", dup); code != 1 || errs != filepath.Join(dup, "b.yaml")+":2: domain \"a\" is already defined in "+filepath.Join(dup, "a.yaml")+":1\n" {
		t.Fatalf("duplicate domain: exit %d, stderr %q", code, errs)
	}

	resv := t.TempDir()
	writeFile(t, resv, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    debit: true\n    reserve: 10\n    rate_limit: {unit: day, requests_per_unit: 50}\n")
	if _, errs, code = runCLI(t, "validate", "--envoy", resv); code != 1 || !strings.HasPrefix(errs, filepath.Join(resv, "a.yaml")+":5: reserve is off") || !strings.Contains(errs, "--envoy-reserve") {
		t.Fatalf("reserve without --envoy-reserve: exit %d, stderr %q", code, errs)
	}
	if out, errs, code = runCLI(t, "validate", "--envoy-reserve", "--envoy", resv); code != 0 || errs != "" {
		t.Fatalf("reserve with --envoy-reserve: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	if _, errs, code = runCLI(t, "validate", "--envoy", filepath.Join(good, "missing")); code != 2 || errs == "" {
		t.Fatalf("missing directory: exit %d, stderr %q", code, errs)
	}
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "README"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code = runCLI(t, "validate", "--envoy", empty); code != 2 || errs == "" {
		t.Fatalf("no files: exit %d, stderr %q", code, errs)
	}
}

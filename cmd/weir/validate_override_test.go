package main

import (
	"strings"
	"testing"
)

// TestValidateEnvoyMaxOverridePeriod: weir validate accepts
// server.envoy_max_override_period and refuses a value out of range with
// its line and column.
func TestValidateEnvoyMaxOverridePeriod(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "server:\n  envoy_max_override_period: 31d\nrules:\n  - {name: a, limit: 5/m}\n")
	if out, errs, code := runCLI(t, "validate", good); code != 0 || out != "ok: 1 rule\n" {
		t.Fatalf("31d: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for _, c := range []struct{ value, want string }{
		{"4000d", ":2:30: envoy_max_override_period 4000d is out of range (1s to 3660d"},
		{"500ms", ":2:30: envoy_max_override_period 500ms is out of range"},
		{"0s", ":2:30: envoy_max_override_period must be positive"},
	} {
		bad := writeFile(t, dir, "bad.yaml", "server:\n  envoy_max_override_period: "+c.value+"\nrules:\n  - {name: a, limit: 5/m}\n")
		if _, errs, code := runCLI(t, "validate", bad); code != 1 || !strings.Contains(errs, bad+c.want) {
			t.Errorf("%s: exit %d, stderr %q, want %q", c.value, code, errs, bad+c.want)
		}
	}
}

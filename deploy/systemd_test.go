package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/server"
)

// systemdAnalyze finds systemd-analyze: a CI run without it fails,
// elsewhere the test is skipped.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is missing (scripts/deps.sh installs Debian's systemd package)")
		}
		t.Skip("no systemd-analyze")
	}
	return p
}

// unitCopy writes deploy/systemd/weir.service into a temporary directory
// with ExecStart pointing at an executable that exists here (verify checks
// it does; this test's own binary stands in for weir).
func unitCopy(t *testing.T) string {
	t.Helper()
	unit, err := os.ReadFile("systemd/weir.service")
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/weir serve") {
		t.Fatal("weir.service: ExecStart does not run /usr/local/bin/weir serve")
	}
	path := filepath.Join(t.TempDir(), "weir.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/weir", exe)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSystemdUnitVerifies(t *testing.T) {
	sa := systemdAnalyze(t)
	out, err := exec.Command(sa, "verify", unitCopy(t)).CombinedOutput()
	if err != nil || strings.Contains(string(out), "weir.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdUnitSecurity: the unit's exposure level under systemd-analyze
// security is at most 2.0 ("OK"), and docs/deployment.md records it.
func TestSystemdUnitSecurity(t *testing.T) {
	sa := systemdAnalyze(t)
	out, err := exec.Command(sa, "security", "--offline=true", "--no-pager", unitCopy(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for weir\.service: ([0-9.]+) (\w+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(m[1], 64)
	if score > 2.0 {
		t.Errorf("exposure level %s %s; want at most 2.0 (OK)\n%s", m[1], m[2], out)
	}
	doc, err := os.ReadFile("../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "exposure level " + m[1] + " " + m[2]; !strings.Contains(string(doc), want) {
		t.Errorf("docs/deployment.md does not record %q", want)
	}
}

// TestSystemdUnitOutlastsDrain: systemd waits longer than weir serve's
// whole shutdown (the delay and the in-flight requests) before SIGKILL, and
// restarts it on failure only.
func TestSystemdUnitOutlastsDrain(t *testing.T) {
	unit, err := os.ReadFile("systemd/weir.service")
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[k] = v
		}
	}
	stop, err := time.ParseDuration(settings["TimeoutStopSec"])
	if err != nil {
		t.Fatalf("TimeoutStopSec=%q: %v", settings["TimeoutStopSec"], err)
	}
	if stop <= server.DefaultShutdownTimeout {
		t.Errorf("TimeoutStopSec=%v; want more than weir's shutdown timeout %v", stop, server.DefaultShutdownTimeout)
	}
	for k, want := range map[string]string{"Restart": "on-failure", "KillSignal": "SIGTERM", "DynamicUser": "yes", "NoNewPrivileges": "yes"} {
		if settings[k] != want {
			t.Errorf("%s=%q; want %q", k, settings[k], want)
		}
	}
}

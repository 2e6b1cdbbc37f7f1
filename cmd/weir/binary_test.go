package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binOut  []byte
)

// weirBinary builds this command once per test run, as `go build` would in
// the checkout (so the binary carries the VCS stamp), and returns its path.
func weirBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "weir-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "weir")
		binOut, binErr = exec.Command("go", "build", "-buildvcs=true", "-o", binPath, ".").CombinedOutput()
	})
	if binErr != nil {
		t.Fatalf("go build: %v\n%s", binErr, binOut)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestVersionFromBuild: a binary built in a git checkout reports the
// checkout's revision and whether its tree was modified.
func TestVersionFromBuild(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	gitDir, _ := exec.Command("git", "rev-parse", "--path-format=absolute", "--git-dir").Output()
	common, _ := exec.Command("git", "rev-parse", "--path-format=absolute", "--git-common-dir").Output()
	if string(gitDir) != string(common) {
		t.Skip("a linked git worktree: the go command stamps no VCS information there")
	}
	out, err := exec.Command(weirBinary(t), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	rev := strings.TrimSpace(string(head))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	// The go command stamps a pseudo-version (v0.0.0-<time>-<rev>[+dirty])
	// since Go 1.24; older ones stamp none, and weir says devel-<rev>.
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "weir ") || !strings.Contains(lines[0], rev[:12]) ||
		!strings.HasPrefix(lines[1], "revision "+rev) || !strings.HasPrefix(lines[2], "built with go") {
		t.Fatalf("weir version printed:\n%s\nwant weir <version naming %s>, revision %s, built with go…", out, rev[:12], rev)
	}
	status, err := exec.Command("git", "status", "--porcelain").Output()
	if err == nil {
		dirty := len(strings.TrimSpace(string(status))) > 0
		if got := strings.HasSuffix(lines[0], "dirty"); got != dirty {
			t.Errorf("version %q: dirty %v, git status says %v", lines[0], got, dirty)
		}
	}
}

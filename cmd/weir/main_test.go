package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestCheckEveryAlgorithm(t *testing.T) {
	for _, algo := range []string{"fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra", "concurrency"} {
		t.Run(algo, func(t *testing.T) {
			out, errs, code := runCLI(t, "check", "--limit", "5/m", "--algorithm", algo, "--key", "alice", "--hits", "7", "--json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 7 {
				t.Fatalf("%d lines, want 7:\n%s", len(lines), out)
			}
			allowed := 0
			for i, ln := range lines {
				var d map[string]any
				if err := json.Unmarshal([]byte(ln), &d); err != nil {
					t.Fatalf("line %d not JSON: %q", i, ln)
				}
				for _, f := range []string{"allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "blocked_until"} {
					if _, ok := d[f]; !ok {
						t.Fatalf("line %d lacks %q: %s", i, f, ln)
					}
				}
				if d["allowed"] == true {
					allowed++
				} else if d["retry_after_ms"].(float64) <= 0 {
					t.Fatalf("rejection without retry_after_ms: %s", ln)
				}
			}
			if allowed != 5 {
				t.Fatalf("%d of 7 allowed under 5/m, want 5", allowed)
			}
		})
	}
}

func TestCheckParallelIsExact(t *testing.T) {
	out, errs, code := runCLI(t, "check", "--limit", "50/h", "--algorithm", "sliding_log", "--hits", "200", "--parallel", "16", "--json")
	if code != 0 {
		t.Fatal(errs)
	}
	if n := strings.Count(out, `"allowed":true`); n != 50 {
		t.Fatalf("%d allowed from 16 goroutines, want 50", n)
	}
}

func TestCheckReadableAndCost(t *testing.T) {
	out, _, code := runCLI(t, "check", "--limit", "10/m", "--algorithm", "token_bucket", "--hits", "3", "--cost", "4")
	if code != 0 {
		t.Fatal(out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "allowed") || !strings.Contains(lines[0], "remaining=6/10") ||
		!strings.Contains(lines[2], "rejected") || !strings.Contains(lines[2], "retry_after=") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

func TestCheckUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"check"},
		{"check", "--limit", "abc"},
		{"check", "--limit", "0/m"},
		{"check", "--limit", "5/m", "--algorithm", "nope"},
		{"check", "--limit", "5/m", "--parallel", "0"},
		{"check", "--limit", "5/m", "extra"},
		{"nosuchcommand"},
	} {
		_, errs, code := runCLI(t, args...)
		if code != 2 || errs == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 with a message", args, code, errs)
		}
	}
	if _, errs, _ := runCLI(t, "check", "--limit", "5/x"); !strings.Contains(errs, `"5/x"`) {
		t.Errorf("a bad limit's error does not quote it: %s", errs)
	}
}

func TestVersion(t *testing.T) {
	out, _, code := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "weir ") {
		t.Fatalf("%q %d", out, code)
	}
}

// TestSubcommandHelpOnStdout: -h and --help print a subcommand's usage to
// stdout and exit 0 ("weir serve --help | less"); a usage error prints the
// error and the usage to stderr and exits 2. Every registered command is
// asked, and each action of weir override.
func TestSubcommandHelpOnStdout(t *testing.T) {
	var cmds [][]string
	for name := range commands {
		cmds = append(cmds, []string{name})
	}
	for _, action := range []string{"set", "list", "delete", "import", "audit"} {
		cmds = append(cmds, []string{"override", action})
	}
	if len(cmds) < 13 {
		t.Fatalf("only %d commands to ask: %v", len(cmds), cmds)
	}
	for _, cmd := range cmds {
		name := strings.Join(cmd, " ")
		for _, h := range []string{"-h", "--help"} {
			out, errs, code := runCLI(t, append(cmd, h)...)
			if code != 0 || errs != "" || !strings.HasPrefix(out, "Usage: weir "+cmd[0]) || !strings.Contains(out, "  -") {
				t.Errorf("weir %s %s: exit %d, stderr %q, stdout %.60q; want 0 and the usage on stdout", name, h, code, errs, out)
			}
		}
		out, errs, code := runCLI(t, append(cmd, "--no-such-flag")...)
		if code != 2 || out != "" || !strings.Contains(errs, "-no-such-flag") || !strings.Contains(errs, "Usage: weir "+cmd[0]) {
			t.Errorf("weir %s --no-such-flag: exit %d, stdout %.60q, stderr %.80q; want 2 and the error and usage on stderr", name, code, out, errs)
		}
	}
}

// TestUsageListsEveryCommandAligned: weir --help lists every command, the
// summaries in one column.
func TestUsageListsEveryCommandAligned(t *testing.T) {
	out, _, code := runCLI(t, "--help")
	col := -1
	n := 0
	for line := range strings.Lines(out) {
		fields := strings.Fields(line)
		if len(fields) < 2 || !strings.HasPrefix(line, "  ") || commands[fields[0]].run == nil {
			continue
		}
		n++
		rest := line[2+len(fields[0]):]
		at := 2 + len(fields[0]) + strings.Index(rest, fields[1])
		if col == -1 {
			col = at
		} else if at != col {
			t.Errorf("summary of %s at column %d, the others at %d:\n%s", fields[0], at, col, out)
		}
	}
	if code != 0 || n != len(commands) {
		t.Errorf("weir --help: exit %d, %d of %d commands listed:\n%s", code, n, len(commands), out)
	}
}

// TestErrorMessagesSayEachThingOnce: a command's message names the command
// once and each layer's context once; an unknown algorithm is no invalid
// limit; a store that cannot be reached exits 1, not the usage error's 2.
func TestErrorMessagesSayEachThingOnce(t *testing.T) {
	closed := closedAddr(t)
	dir := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check", "--limit", "5/m", "--algorithm", "gcraa"}, 2, `weir check: --algorithm: unknown algorithm "gcraa" (did you mean "gcra"?)` + "\n"},
		{[]string{"check", "--limit", "5/m", "--algorithm", "bogus"}, 2,
			`weir check: --algorithm: unknown algorithm "bogus" (want fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra or concurrency)` + "\n"},
		{[]string{"check", "--limit", "5/x"}, 2, `weir check: invalid limit "5/x": period "x" is not a duration (use s, m, h, d, 30s, 15m, 7d)` + "\n"},
		{[]string{"check", "--limit", "5/m", "--redis", "redis://" + closed + "/0"}, 1, "weir check: --redis: store failed: connect to " + closed + ": "},
		{[]string{"serve", "--envoy-config", dir, "--http", "127.0.0.1:0", "--grpc", "off"}, 1, "weir serve: envoy config: open " + dir + ": no such file or directory\n"},
	} {
		_, errs, code := runCLI(t, tc.args...)
		if code != tc.code || !strings.HasPrefix(errs, tc.want) {
			t.Errorf("weir %s: exit %d, stderr %q; want %d, %q", strings.Join(tc.args, " "), code, errs, tc.code, tc.want)
		}
	}
}

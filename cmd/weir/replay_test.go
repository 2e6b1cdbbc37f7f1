package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The worked example of docs/replay.md: the numbers it quotes.
func TestReplayExample(t *testing.T) {
	out, errs, code := runCLI(t, "replay", "--config", "../../examples/replay/weir.yaml", "--json", "../../examples/replay/access.log.gz")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep struct {
		Lines, Skipped int64
		From, To       string
		Rules          []struct {
			Name              string
			Matched, Limited  int64
			ShadowLimited     int64 `json:"shadow_limited"`
			Identities        int64
			LimitedIdentities int64 `json:"limited_identities"`
			Top               []struct{ Identity string }
		}
		NotEvaluated []struct{ Rule, Reason string } `json:"not_evaluated"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Lines != 4432 || rep.Skipped != 1 || rep.From != "2026-11-23T14:00:00Z" || len(rep.Rules) != 3 {
		t.Fatalf("%+v", rep)
	}
	want := map[string][3]int64{"login": {195, 0, 1}, "site": {682, 0, 1}, "search": {0, 51, 1}}
	top := map[string]string{"login": "192.0.2.14", "site": "203.0.113.66", "search": "198.51.100.23"}
	for _, r := range rep.Rules {
		if got := [3]int64{r.Limited, r.ShadowLimited, r.LimitedIdentities}; got != want[r.Name] || r.Top[0].Identity != top[r.Name] {
			t.Errorf("%s: %+v", r.Name, r)
		}
	}
	if len(rep.NotEvaluated) != 1 || rep.NotEvaluated[0].Rule != "api" {
		t.Fatalf("not evaluated: %+v", rep.NotEvaluated)
	}
}

// Text, stdin, flags after the logs, --html, --compare and --suggest.
func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "access.log")
	var b strings.Builder
	for i := 0; i < 40; i++ {
		b.WriteString(`198.51.100.7 - - [23/Nov/2026:09:00:` + twoDigits(i) + ` +0000] "GET /x HTTP/1.1" 200 1 "-" "ua"` + "\n")
	}
	os.WriteFile(logPath, []byte(b.String()), 0o644)
	cfg := filepath.Join(dir, "weir.yaml")
	os.WriteFile(cfg, []byte("rules:\n  - name: ip\n    limit: 10/m\n    algorithm: fixed_window\n"), 0o644)
	other := filepath.Join(dir, "other.yaml")
	os.WriteFile(other, []byte("rules:\n  - name: ip\n    limit: 30/m\n    algorithm: fixed_window\n"), 0o644)

	old := stdin
	defer func() { stdin = old }()
	f, _ := os.Open(logPath)
	defer f.Close()
	stdin = f
	html := filepath.Join(dir, "r.html")
	out, errs, code := runCLI(t, "replay", "-", "--config", cfg, "--html", html)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"40 lines (nginx combined)", "ip", "30", "75.0%", "198.51.100.7", "2026-11-23T09:00"} {
		if !strings.Contains(out, want) {
			t.Fatalf("text lacks %q:\n%s", want, out)
		}
	}
	if page, err := os.ReadFile(html); err != nil || !strings.Contains(string(page), "<svg") {
		t.Fatalf("--html: %v", err)
	}

	out, errs, code = runCLI(t, "replay", "--config", cfg, "--compare", other, logPath)
	if code != 0 || !strings.Contains(out, "-20") {
		t.Fatalf("--compare: exit %d %s\n%s", code, errs, out)
	}
	out, errs, code = runCLI(t, "replay", "--config", cfg, "--suggest", "ip", "--target", "0%", logPath)
	if code != 0 || !strings.Contains(out, "\nlimit: 40/m\n") {
		t.Fatalf("--suggest: exit %d %s\n%s", code, errs, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", logPath}, "--config is required"},
		{[]string{"replay", "--config", cfg}, "at least one log"},
		{[]string{"replay", "--config", cfg, "--target", "5%", logPath}, "--target goes with --suggest"},
		{[]string{"replay", "--config", cfg, "--suggest", "ip", "--target", "150%", logPath}, `"150%"`},
		{[]string{"replay", "--config", cfg, "--format", "apache", logPath}, `"apache"`},
		{[]string{"replay", "--config", cfg, "--field", "time", logPath}, `"time"`},
		{[]string{"replay", "--config", cfg, filepath.Join(dir, "missing.log")}, "missing.log"},
	} {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to name %q", c.args[1:], code, errs, c.want)
		}
	}
}

func twoDigits(i int) string { return string([]byte{byte('0' + i/10), byte('0' + i%10)}) }

// wrongPlural finds a count of one with a plural noun.
var wrongPlural = regexp.MustCompile(`(^|[^0-9.,])1 (lines|identities|passes|requests|minutes|calls|callers|connections|keys|rules|entries|attempts|seconds)\b`)

// TestPluralsInRenderedOutputs: wherever the commands print a count, one
// thing is singular: replay's text, --html, --compare and --suggest, and
// bench's summary.
func TestPluralsInRenderedOutputs(t *testing.T) {
	dir := t.TempDir()
	logPath := writeFile(t, dir, "access.log", `198.51.100.7 - - [23/Nov/2026:09:00:00 +0000] "GET /x HTTP/1.1" 200 1 "-" "ua"`+"\n")
	cfg := writeFile(t, dir, "weir.yaml", "rules:\n  - name: ip\n    limit: 10/m\n")
	html := filepath.Join(dir, "r.html")
	var outputs []string
	for _, args := range [][]string{
		{"replay", "--config", cfg, "--html", html, logPath},
		{"replay", "--config", cfg, "--compare", cfg, logPath},
		{"replay", "--config", cfg, "--suggest", "ip", "--target", "0%", logPath},
	} {
		out, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		outputs = append(outputs, out)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, string(page))
	for _, want := range []string{"1 line (nginx combined)", "of its 1 identity would"} {
		if !strings.Contains(strings.Join(outputs, "\n"), want) {
			t.Errorf("no %q in\n%s", want, strings.Join(outputs, "\n"))
		}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"allowed":true}`)) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	out, _, code := runCLI(t, "bench", "--addr", srv.URL, "--requests", "1", "--concurrency", "1", "--keys", "1", "--quiet")
	if code != 0 || !strings.Contains(out, "1 caller over 1 connection, 1 key (uniform)") {
		t.Errorf("bench: exit %d\n%s", code, out)
	}
	outputs = append(outputs, out)
	for _, o := range outputs {
		if m := wrongPlural.FindString(o); m != "" {
			t.Errorf("%q in\n%s", m, o)
		}
	}
}

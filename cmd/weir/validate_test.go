package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "rules:\n  - {name: a, limit: 5/m}\n  - {name: b, limit: 5/m}\n")
	one := writeFile(t, dir, "one.yaml", "rules:\n  - {name: a, limit: 5/m}\n")
	bad := writeFile(t, dir, "bad.yaml", "rules:\n  - {name: a, limit: 5/x}\n  - name: a\n    limt: 1/m\n")

	out, errs, code := runCLI(t, "validate", good)
	if code != 0 || out != "ok: 2 rules\n" || errs != "" {
		t.Fatalf("good: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, _, code := runCLI(t, "validate", one); code != 0 || out != "ok: 1 rule\n" {
		t.Fatalf("one: exit %d, %q", code, out)
	}

	out, errs, code = runCLI(t, "validate", bad)
	want := bad + ":2:22: invalid limit \"5/x\": period \"x\" is not a duration (use s, m, h, d, 30s, 15m, 7d)\n" +
		bad + ":3:5: rule \"a\" needs a limit (such as limit: 100/m) or tiers\n" +
		bad + ":3:11: duplicate rule name \"a\" (first at line 2)\n" +
		bad + ":4:5: unknown field \"limt\" in rule (did you mean \"limit\"?)\n"
	if code != 1 || out != "" || errs != want {
		t.Fatalf("bad: exit %d, stdout %q, stderr:\n%s\nwant:\n%s", code, out, errs, want)
	}

	out, errs, code = runCLI(t, "validate", good, bad)
	if code != 1 || out != good+": ok: 2 rules\n" || strings.Count(errs, "\n") != 4 {
		t.Fatalf("both: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if out, _, code := runCLI(t, "validate", "-q", good); code != 0 || out != "" {
		t.Fatalf("-q: exit %d, %q", code, out)
	}
}

func TestValidateUsage(t *testing.T) {
	if _, errs, code := runCLI(t, "validate"); code != 2 || !strings.Contains(errs, "no file given") {
		t.Fatalf("no args: exit %d, %q", code, errs)
	}
	if _, _, code := runCLI(t, "validate", "--nope", "x.yaml"); code != 2 {
		t.Fatalf("bad flag: exit %d", code)
	}
	if _, errs, code := runCLI(t, "validate", filepath.Join(t.TempDir(), "missing.yaml")); code != 2 || !strings.Contains(errs, "no such file") {
		t.Fatalf("missing file: exit %d, %q", code, errs)
	}
	if _, _, code := runCLI(t, "validate", "-h"); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
}

// TestValidateGRPCOff: server.grpc: off is valid, as weir serve --grpc off
// is; an address that is not one is still refused at its line and column.
func TestValidateGRPCOff(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"off", `"off"`} {
		p := writeFile(t, dir, "off.yaml", "server: {grpc: "+v+"}\nrules:\n  - {name: a, limit: 5/m}\n")
		if out, errs, code := runCLI(t, "validate", p); code != 0 || out != "ok: 1 rule\n" || errs != "" {
			t.Fatalf("grpc: %s: exit %d, stdout %q, stderr %q", v, code, out, errs)
		}
	}
	for _, v := range []string{"of", "localhost:99999", "false"} {
		p := writeFile(t, dir, "bad.yaml", "server:\n  grpc: "+v+"\nrules:\n  - {name: a, limit: 5/m}\n")
		want := p + ":2:9: grpc \"" + v + "\" must be host:port or :port, such as :8080, or off to serve none\n"
		if out, errs, code := runCLI(t, "validate", p); code != 1 || out != "" || errs != want {
			t.Fatalf("grpc: %s: exit %d, stdout %q, stderr %q, want %q", v, code, out, errs, want)
		}
	}
}

// TestValidateProtect: weir validate checks the protect and system
// sections, each problem with its line and column.
func TestValidateProtect(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", `rules: []
protect:
  - name: api
    match: {path: /api/}
    concurrency: adaptive
    max_concurrency: 1000
    priority: header:X-Priority
    reserve: 20%
  - name: payments
    match: {path: /api/pay}
    breaker: {slow_call: 500ms, slow_ratio: 0.5, error_ratio: 0.5, errors: 0, min_requests: 20, window: 10s, open_for: 10s}
system:
  max_cpu: 85%
  max_inflight: 2000
`)
	if out, errs, code := runCLI(t, "validate", good); code != 0 || out != "ok: 0 rules, 2 protect rules\n" {
		t.Fatalf("good: exit %d, %q, %q", code, out, errs)
	}
	bad := writeFile(t, dir, "bad.yaml", `protect:
  - name: api
    concurrency: adaptive
    min_concurrency: 20
    max_concurrency: 10
    priority: header:X-Priority
    reserve: 120%
    breaker: {error_ratio: 1.5, open_for: -1s}
system:
  max_cpu: 85
`)
	_, errs, code := runCLI(t, "validate", bad)
	want := bad + ":4:22: min_concurrency 20 is above max_concurrency 10\n" +
		bad + ":7:14: reserve \"120%\" must be a share of the limit from 0% to below 100%, such as 20% or 0.2\n" +
		bad + ":8:28: error_ratio must be between 0 and 1, got 1.5\n" +
		bad + ":8:43: open_for must be positive, got \"-1s\"\n" +
		bad + ":10:12: max_cpu \"85\" must be a share of the CPU above 0% and at most 100%, such as 85%\n"
	if code != 1 || errs != want {
		t.Fatalf("bad: exit %d, stderr:\n%s\nwant:\n%s", code, errs, want)
	}
}

// TestValidateUnsettledRules: weir validate refuses what weir serve
// refuses, a count: rule and a cost: read from the request, each at its
// line and column and naming the rule; -middleware checks the file for
// Go's policy middleware, which settles them.
func TestValidateUnsettledRules(t *testing.T) {
	p := writeFile(t, t.TempDir(), "login.yaml", `rules:
  - name: failed-logins
    match: { methods: [POST], path: /login }
    limit: 5/15m
    algorithm: fixed_window
    count: { status: [401, 403] }
  - name: tokens
    limit: 1000/m
    algorithm: token_bucket
    cost: header:X-Tokens
`)
	out, errs, code := runCLI(t, "validate", p)
	want := p + ":6:12: rule \"failed-logins\": weir serve cannot settle count:"
	if code != 1 || out != "" || !strings.HasPrefix(errs, want) || !strings.Contains(errs, "\n"+p+":10:11: rule \"tokens\": weir serve cannot settle cost: header:X-Tokens") {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s\nwant it to start with %s", code, out, errs, want)
	}
	if out, errs, code := runCLI(t, "validate", "-middleware", p); code != 0 || out != "ok: 2 rules\n" || errs != "" {
		t.Fatalf("-middleware: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestValidateHelpsFix: an indentation error is reported on the line that
// breaks the indentation, a tab with a hint, and a misspelt algorithm or
// identity kind with the name meant; "ok" names each of several files.
func TestValidateHelpsFix(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, want string }{
		{"indent.yaml", "rules:\n  - name: a\n    limit: 5/m\n  - name: b\n   limit: 5/m\n",
			":5: YAML syntax: did not find expected '-' indicator\n"},
		{"tab.yaml", "rules:\n  - name: a\n\tlimit: 5/m\n",
			":3: YAML syntax: found a tab character that violates indentation (indent with spaces: YAML does not allow tabs)\n"},
		{"misspelt.yaml", "rules:\n  - name: a\n    limit: 5/m\n    algorithm: gcraa\n  - name: b\n    limit: 5/m\n    identity: [iq, heder:X-Key]\n",
			":4:16: unknown algorithm \"gcraa\" (did you mean \"gcra\"?)\n" +
				"%[1]s:7:16: unknown identity \"iq\" (did you mean \"ip\"? want ip, ip/BITS, header:NAME, trusted_header:NAME, cookie:NAME, query:NAME, method, route or const:VALUE)\n" +
				"%[1]s:7:20: unknown identity \"heder:X-Key\" (did you mean \"header:X-Key\"? want ip, ip/BITS, header:NAME, trusted_header:NAME, cookie:NAME, query:NAME, method, route or const:VALUE)\n"},
	} {
		p := writeFile(t, dir, tc.name, tc.yaml)
		want := p + strings.ReplaceAll(tc.want, "%[1]s", p)
		if out, errs, code := runCLI(t, "validate", p); code != 1 || out != "" || errs != want {
			t.Errorf("%s: exit %d, stdout %q, stderr:\n%s\nwant:\n%s", tc.name, code, out, errs, want)
		}
	}
	a := writeFile(t, dir, "a.yaml", "rules:\n  - {name: a, limit: 5/m}\n")
	b := writeFile(t, dir, "b.yaml", "rules:\n  - {name: a, limit: 5/m}\n  - {name: b, limit: 5/m}\nprotect:\n  - {name: p, concurrency: 10}\n")
	if out, errs, code := runCLI(t, "validate", a, b); code != 0 || out != a+": ok: 1 rule\n"+b+": ok: 2 rules, 1 protect rule\n" {
		t.Errorf("several files: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

func init() {
	register("override", "set, list, delete, import or audit per-identity limit overrides through weir serve's admin API", runOverride)
}

const overrideUsage = `Usage: weir override <action> [flags]

  weir override set    --rule R --key K --limit "20/m burst 5" [--until 2030-01-31T00:00:00Z] [--note TEXT]
  weir override list   --rule R
  weir override delete --rule R --key K
  weir override import FILE   (JSON lines: {"rule","key","limit","until","note"}; - reads stdin)
  weir override audit  [--since ID|2030-01-31T00:00:00Z] [--count N]   (the log of changes, oldest first)

Talks to weir serve's admin API (--url, default http://127.0.0.1:8080) with
the bearer token in $WEIR_ADMIN_TOKEN (or the variable --token-env names).
A key ending in * is a pattern: "acme-*" covers every identity that starts
with acme-. An override keeps the identity's count: raising 10/m to 20/m
mid-window admits 10 more in that window.

Flags:`

// runOverride runs weir override.
func runOverride(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stdout, overrideUsage)
			return 0
		}
		if len(args) == 0 {
			fmt.Fprint(stderr, "weir override: name an action: set, list, delete, import or audit\n\n")
		} else {
			fmt.Fprintf(stderr, "weir override: %q is no action; name one first: set, list, delete, import or audit\n\n", args[0])
		}
		fmt.Fprintln(stderr, overrideUsage)
		return 2
	}
	verb := args[0]
	fs := newFlagSet("weir override "+verb, overrideUsage, stderr)
	base := fs.String("url", "http://127.0.0.1:8080", "weir serve's address")
	tokenEnv := fs.String("token-env", "WEIR_ADMIN_TOKEN", "the environment variable holding the admin token")
	timeout := fs.Duration("timeout", 10*time.Second, "how long each request may take")
	rule := fs.String("rule", "", "the rule")
	key := fs.String("key", "", "the identity, or a pattern ending in *")
	limit := fs.String("limit", "", `the override's rate, period and burst, such as "20/m burst 5"`)
	until := fs.String("until", "", "RFC 3339 time at which the override stops applying (default: never)")
	note := fs.String("note", "", "who set it and why")
	since := fs.String("since", "", "audit: the changes after this change's id, or at or after this RFC 3339 time")
	count := fs.Int("count", 0, "audit: at most this many changes (default: the server's, 100)")
	// Flags may follow the file of import: every flag here takes a value.
	var flags, pos []string
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-h" || a == "--help" || !strings.HasPrefix(a, "-") || a == "-":
			if strings.HasPrefix(a, "-") && a != "-" {
				flags = append(flags, a)
			} else {
				pos = append(pos, a)
			}
		case strings.Contains(a, "=") || i+1 == len(args):
			flags = append(flags, a)
		default:
			flags = append(flags, a, args[i+1])
			i++
		}
	}
	if code, ok := parseFlags(fs, append(flags, pos...), stdout); !ok {
		return code
	}
	c := adminClient{base: strings.TrimRight(*base, "/"), token: os.Getenv(*tokenEnv), http: &http.Client{Timeout: *timeout}}
	switch verb {
	case "set":
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "weir override set: unexpected argument %q\n", fs.Arg(0))
			return 2
		}
		body := map[string]string{"rule": *rule, "key": *key, "limit": *limit, "until": *until, "note": *note}
		out, err := c.do("PUT", "/v1/overrides", body)
		return report(out, err, stdout, stderr)
	case "list":
		out, err := c.do("GET", "/v1/overrides?rule="+url.QueryEscape(*rule), nil)
		return report(out, err, stdout, stderr)
	case "delete":
		out, err := c.do("DELETE", "/v1/overrides?rule="+url.QueryEscape(*rule)+"&key="+url.QueryEscape(*key), nil)
		return report(out, err, stdout, stderr)
	case "audit":
		q := url.Values{}
		if *since != "" {
			q.Set("since", *since)
		}
		if *count != 0 {
			q.Set("limit", strconv.Itoa(*count))
		}
		path := "/v1/overrides/audit"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		out, err := c.do("GET", path, nil)
		return report(out, err, stdout, stderr)
	case "import":
		if fs.NArg() != 1 {
			fmt.Fprintln(stderr, "weir override import: name one file (- for stdin)")
			return 2
		}
		return c.importFile(fs.Arg(0), stdout, stderr)
	}
	fmt.Fprintf(stderr, "weir override: unknown action %q (set, list, delete, import or audit)\n", verb)
	return 2
}

// adminClient calls weir serve's admin API.
type adminClient struct {
	base, token string
	http        *http.Client
}

// do sends a request with body as JSON (nil: none) and returns the
// answer's body, or an error carrying the server's message.
func (c adminClient) do(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Detail string }
		if json.Unmarshal(out, &e) == nil && e.Detail != "" {
			return nil, fmt.Errorf("%s: %s", resp.Status, e.Detail)
		}
		return nil, fmt.Errorf("%s", resp.Status)
	}
	return out, nil
}

// report prints a successful answer, or the error.
func report(out []byte, err error, stdout, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintln(stderr, "weir override:", err)
		return 1
	}
	stdout.Write(out)
	return 0
}

// importFile sets every override of a JSON-lines file, one request each,
// and reports each line that failed; it exits 1 if any did.
func (c adminClient) importFile(name string, stdout, stderr io.Writer) int {
	var r io.Reader = os.Stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(stderr, "weir override import:", err)
			return 1
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	line, set, failed := 0, 0, 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		var o map[string]any
		dec := json.NewDecoder(strings.NewReader(text))
		if err := dec.Decode(&o); err != nil {
			fmt.Fprintf(stderr, "%s:%d: not a JSON object: %v\n", name, line, err)
			failed++
			continue
		}
		if _, err := c.do("PUT", "/v1/overrides", o); err != nil {
			fmt.Fprintf(stderr, "%s:%d: %v\n", name, line, err)
			failed++
			continue
		}
		set++
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(stderr, "%s:%d: %v\n", name, line+1, err)
		failed++
	}
	fmt.Fprintf(stdout, "weir override import: %d set, %d failed\n", set, failed)
	if failed > 0 {
		return 1
	}
	return 0
}

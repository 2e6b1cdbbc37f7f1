package replay

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// run replays log under the YAML config and returns the report and each
// line's Record as decided.
func run(t *testing.T, yamlText, log string, o Options) (*Report, []Record) {
	t.Helper()
	cfg, err := policy.Parse([]byte(yamlText), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var recs []Record
	o.observe = func(r *Record, _ int, _ *policy.Verdict) { recs = append(recs, *r) }
	reps, err := Run(context.Background(), []Input{{Name: "t.log", R: strings.NewReader(log)}}, []*config.Config{cfg}, o)
	if err != nil {
		t.Fatal(err)
	}
	return reps[0], recs
}

const twoPerMinute = `
rules:
  - name: ip
    limit: 2/m
    algorithm: fixed_window
`

func ruleOf(t *testing.T, r *Report, name string) RuleReport {
	t.Helper()
	for _, rr := range r.Rules {
		if rr.Name == name {
			return rr
		}
	}
	t.Fatalf("no rule %q in %+v", name, r.Rules)
	return RuleReport{}
}

// Every format is detected from its first line, and its fields land where
// the policy reads them.
func TestFormats(t *testing.T) {
	cases := []struct {
		name, format, line string
		want               Record
	}{
		{"nginx combined", "nginx combined",
			`203.0.113.9 - bob [23/Nov/2026:10:00:01 +0100] "GET /a/b?x=1 HTTP/1.1" 200 612 "https://ref.example/" "curl/8.5.0"`,
			Record{Time: 1795424401e6, Addr: "203.0.113.9", Method: "GET", URI: "/a/b?x=1", Status: 200, UA: "curl/8.5.0", Referer: "https://ref.example/"}},
		{"nginx main", "nginx main",
			`10.0.0.1 - - [23/Nov/2026:09:00:01 +0000] "POST /login HTTP/2.0" 401 0 "-" "Mozilla/5.0" "198.51.100.7, 10.0.0.9"`,
			Record{Time: 1795424401e6, Addr: "10.0.0.1", Method: "POST", URI: "/login", Status: 401, UA: "Mozilla/5.0", XFF: "198.51.100.7, 10.0.0.9"}},
		{"envoy", "envoy",
			`[2026-11-23T09:00:01.250Z] "GET /api/v1/x HTTP/1.1" 200 - 0 15 3 2 "198.51.100.7,203.0.113.9" "curl/8.5.0" "1f2e" "api.example.com" "10.1.2.3:8080"`,
			Record{Time: 1795424401250000, Addr: "203.0.113.9", Method: "GET", URI: "/api/v1/x", Host: "api.example.com", Status: 200, UA: "curl/8.5.0", XFF: "198.51.100.7", Extra: []Header{{"X-Request-Id", "1f2e"}}}},
		{"envoy json", "envoy json",
			`{"start_time":"2026-11-23T09:00:01.000Z","method":"GET","path":"/p","protocol":"HTTP/1.1","response_code":429,"x_forwarded_for":"-","user_agent":"ua","request_id":"-","authority":"h.example","downstream_remote_address":"203.0.113.9:5555"}`,
			Record{Time: 1795424401e6, Addr: "203.0.113.9:5555", Method: "GET", URI: "/p", Host: "h.example", Status: 429, UA: "ua"}},
		{"caddy", "caddy",
			`{"level":"info","ts":1795424401.5,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"2001:db8::7","remote_port":"41342","client_ip":"2001:db8::7","proto":"HTTP/2.0","method":"GET","host":"shop.example","uri":"/cart?id=3","headers":{"User-Agent":["curl/8.5.0"],"X-Api-Key":["k1"],"Cookie":["REDACTED"]}},"duration":0.25,"status":200}`,
			Record{Time: 1795424401250000, Addr: "[2001:db8::7]:41342", Method: "GET", URI: "/cart?id=3", Host: "shop.example", Status: 200, UA: "curl/8.5.0", Extra: []Header{{"X-Api-Key", "k1"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep, recs := run(t, twoPerMinute, c.line+"\n", Options{})
			if rep.Format != c.format || rep.Skipped != 0 || len(recs) != 1 {
				t.Fatalf("format %q (want %q), skipped %d %v", rep.Format, c.format, rep.Skipped, rep.SkippedLines)
			}
			got := recs[0]
			got.Line, got.Input = 0, 0
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("record\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// The jsonl mapping reads nested fields, several time forms and headers.
func TestJSONL(t *testing.T) {
	log := `{"t":"2026-11-23T09:00:00.5Z","c":{"ip":"198.51.100.1"},"m":"post","u":"/x","key":"k1"}
{"t":1795424400.9,"c":{"ip":"198.51.100.1"},"m":"POST","u":"/x","key":"k1"}
{"t":1795424401000,"c":{"ip":"198.51.100.1"},"m":"POST","u":"/x","key":"k1"}
{"t":"23/Nov/2026:09:00:02 +0000","c":{"ip":"198.51.100.1"},"u":"/x","key":"k2"}
{"t":"yesterday","u":"/x"}
`
	cfg := `
rules:
  - name: key
    identity: ["header:X-API-Key"]
    limit: 2/m
    algorithm: fixed_window
`
	rep, recs := run(t, cfg, log, Options{Format: FormatJSONL, Fields: map[string]string{"time": "t", "ip": "c.ip", "method": "m", "uri": "u", "header:X-API-Key": "key"}})
	if rep.Skipped != 1 || rep.SkippedLines[0].Line != 5 || !strings.Contains(rep.SkippedLines[0].Error, "yesterday") {
		t.Fatalf("skipped %d %+v", rep.Skipped, rep.SkippedLines)
	}
	if len(recs) != 4 || recs[0].Method != "POST" || recs[1].Time != 1795424400900000 || recs[2].Time != 1795424401000000 || recs[3].Method != "GET" {
		t.Fatalf("records %+v", recs)
	}
	r := ruleOf(t, rep, "key")
	if r.Matched != 4 || r.Limited != 1 || r.Identities != 2 || r.LimitedIdentities != 1 || r.Top[0] != (Top{"k1", 1}) {
		t.Fatalf("rule %+v", r)
	}
	if _, err := Run(context.Background(), []Input{{Name: "x", R: strings.NewReader(log)}}, nil, Options{Format: FormatJSONL, Fields: map[string]string{"ip": "c"}}); err == nil || !strings.Contains(err.Error(), "time=") {
		t.Fatalf("a mapping without time: %v", err)
	}
	if _, err := Run(context.Background(), []Input{{Name: "x", R: strings.NewReader(log)}}, nil, Options{Format: FormatJSONL, Fields: map[string]string{"time": "t", "size": "s"}}); err == nil || !strings.Contains(err.Error(), `"size"`) {
		t.Fatalf("an unknown name: %v", err)
	}
}

func nginxLine(ip string, sec int, path string) string {
	return fmt.Sprintf("%s - - [23/Nov/2026:09:%02d:%02d +0000] \"GET %s HTTP/1.1\" 200 1 \"-\" \"ua\"", ip, sec/60, sec%60, path)
}

// Unreadable lines are counted, the first ten named, and never stop the
// run; gzip is read as such.
func TestSkippedAndGzip(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= 30; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "garbage %d\n", i)
			continue
		}
		b.WriteString(nginxLine("198.51.100.1", i, "/") + "\n")
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(b.String()))
	zw.Close()
	cfg, _ := policy.Parse([]byte(twoPerMinute), "t.yaml")
	reps, err := Run(context.Background(), []Input{{Name: "a.log.gz", R: &gz}}, []*config.Config{cfg}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := reps[0]
	if rep.Lines != 30 || rep.Skipped != 15 || len(rep.SkippedLines) != 10 {
		t.Fatalf("lines %d skipped %d listed %d", rep.Lines, rep.Skipped, len(rep.SkippedLines))
	}
	for i, l := range rep.SkippedLines {
		if l.Line != int64(2*(i+1)) || l.Input != "a.log.gz" || l.Error == "" {
			t.Fatalf("skipped line %d: %+v", i, l)
		}
	}
	if r := ruleOf(t, rep, "ip"); r.Matched != 15 || r.Limited != 13 {
		t.Fatalf("rule %+v", r)
	}
}

// Lines out of order within the window are decided in time order, as if
// sorted; a line older than one already decided is late: reported, and
// decided at that time.
func TestOutOfOrder(t *testing.T) {
	sorted := []string{nginxLine("a.0.0.1", 0, "/"), nginxLine("198.51.100.1", 1, "/"), nginxLine("198.51.100.1", 2, "/"), nginxLine("198.51.100.1", 3, "/"), nginxLine("198.51.100.1", 59, "/"), nginxLine("198.51.100.1", 61, "/")}
	shuffled := []string{sorted[0], sorted[3], sorted[1], sorted[2], sorted[5], sorted[4]}
	cfg := `
rules:
  - name: ip
    limit: 3/m
    algorithm: sliding_log
`
	a, ra := run(t, cfg, strings.Join(sorted, "\n"), Options{})
	b, rb := run(t, cfg, strings.Join(shuffled, "\n"), Options{})
	if a.Late != 0 || b.Late != 0 || !reflect.DeepEqual(a.Rules, b.Rules) {
		t.Fatalf("sorted %+v late %d, shuffled %+v late %d", a.Rules, a.Late, b.Rules, b.Late)
	}
	for i := range ra {
		if ra[i].Time != rb[i].Time {
			t.Fatalf("decided out of order: %d vs %d", ra[i].Time, rb[i].Time)
		}
	}
	// 10 s late with a 5 s window.
	late := []string{nginxLine("198.51.100.1", 30, "/"), nginxLine("198.51.100.1", 40, "/"), nginxLine("198.51.100.1", 50, "/"), nginxLine("198.51.100.1", 35, "/")}
	c, rc := run(t, cfg, strings.Join(late, "\n"), Options{})
	if c.Late != 1 || c.LateLines[0].Line != 4 || rc[2].Line != 4 || rc[2].Time != rc[1].Time {
		t.Fatalf("late %d %+v, decided %+v", c.Late, c.LateLines, rc)
	}
	// A wider window takes it in order.
	d, _ := run(t, cfg, strings.Join(late, "\n"), Options{Window: 30e9})
	if d.Late != 0 {
		t.Fatalf("late %d with a 30 s window", d.Late)
	}
}

// What the log does not record is reported, not guessed: rules that need
// it are left out, with the reason.
func TestNotEvaluated(t *testing.T) {
	cfg := `
allow:
  - { identity: "header:X-Internal", values: [yes] }
rules:
  - name: key
    identity: ["header:X-API-Key"]
    limit: 2/m
  - name: host
    match: { host: api.example.com }
    limit: 2/m
  - name: session
    identity: ["cookie:sid"]
    limit: 2/m
  - name: conc
    limit: 2/m
    algorithm: concurrency
  - name: tiered
    tiers:
      by: header:X-Plan
      default: { limit: 2/m }
  - name: agent
    identity: ["header:User-Agent"]
    limit: 2/m
`
	rep, _ := run(t, cfg, nginxLine("198.51.100.1", 1, "/")+"\n", Options{})
	got := map[string]string{}
	for _, n := range rep.NotEvaluated {
		got[n.Rule] = n.Reason
	}
	for rule, want := range map[string]string{
		"key": "header X-API-Key", "host": "Host", "session": "cookies", "conc": "concurrency",
		"tiered": "tiers.by header:X-Plan", "allow_values[0]": "X-Internal",
	} {
		if !strings.Contains(got[rule], want) {
			t.Errorf("%s: reason %q, want it to name %q", rule, got[rule], want)
		}
	}
	if len(rep.Rules) != 1 || rep.Rules[0].Name != "agent" || rep.Rules[0].Matched != 1 {
		t.Fatalf("evaluated %+v", rep.Rules)
	}
	// Caddy logs every header (but cookies, redacted): the same rules run.
	line := `{"ts":1795424401,"request":{"remote_ip":"198.51.100.1","method":"GET","host":"api.example.com","uri":"/","headers":{"X-Api-Key":["k"],"Cookie":["REDACTED"]}}}`
	rep, _ = run(t, cfg, line+"\n", Options{})
	var names []string
	for _, n := range rep.NotEvaluated {
		names = append(names, n.Rule)
	}
	if strings.Join(names, ",") != "session,conc" {
		t.Fatalf("caddy: not evaluated %v", rep.NotEvaluated)
	}
}

// The JSON report keeps its stable schema.
func TestJSONSchema(t *testing.T) {
	rep, _ := run(t, twoPerMinute, strings.Repeat(nginxLine("198.51.100.1", 1, "/")+"\n", 3), Options{})
	b, _ := json.Marshal(rep)
	var m map[string]any
	json.Unmarshal(b, &m)
	for _, k := range []string{"lines", "skipped", "from", "to", "rules"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("no %q in %s", k, b)
		}
	}
	rule := m["rules"].([]any)[0].(map[string]any)
	want := map[string]any{"name": "ip", "matched": 3.0, "limited": 1.0, "shadow_limited": 0.0, "identities": 1.0, "limited_identities": 1.0,
		"top": []any{map[string]any{"identity": "198.51.100.1", "limited": 1.0}}}
	if !reflect.DeepEqual(rule, want) {
		t.Fatalf("rule\n got %v\nwant %v", rule, want)
	}
	if m["from"] != "2026-11-23T09:00:01Z" || m["to"] != "2026-11-23T09:00:01Z" || m["lines"] != 3.0 {
		t.Fatalf("%s", b)
	}
}

// A line longer than maxLine is skipped and counted, and the lines after
// it are read; the memory it takes stays bounded.
func TestLongLine(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	log := nginxLine("198.51.100.1", 1, "/") + "\n" + long + "\n" + nginxLine("198.51.100.1", 2, "/") + "\n"
	rep, recs := run(t, twoPerMinute, log, Options{})
	if rep.Lines != 3 || rep.Skipped != 1 || rep.SkippedLines[0].Line != 2 || !strings.Contains(rep.SkippedLines[0].Error, "longer than 4 MB") || len(recs) != 2 || recs[1].Line != 3 {
		t.Fatalf("lines %d skipped %d %+v, decided %d", rep.Lines, rep.Skipped, rep.SkippedLines, len(recs))
	}
}

// A config for Redis replays on the memory store: nothing connects.
func TestRedisConfigReplaysInMemory(t *testing.T) {
	cfg := "store:\n  type: redis\n  redis: { addrs: [\"127.0.0.1:1\"] }\n" + twoPerMinute
	rep, _ := run(t, cfg, strings.Repeat(nginxLine("198.51.100.1", 1, "/")+"\n", 3), Options{})
	if r := ruleOf(t, rep, "ip"); r.Limited != 1 {
		t.Fatalf("%+v", r)
	}
}

// The progress bar shows the share read when the size is known.
func TestBar(t *testing.T) {
	if got := bar(50<<20, 100<<20, 2e9); !strings.Contains(got, " 50%") || !strings.Contains(got, "50/100 MB") || !strings.Contains(got, "25 MB/s") {
		t.Fatalf("%q", got)
	}
	if got := bar(10<<20, 0, 1e9); got != "replay: 10 MB read, 10 MB/s" {
		t.Fatalf("%q", got)
	}
}

// TestCountAndCostRules: a count rule counts the lines whose logged status
// it lists (taking before, giving the others back after, as the middleware
// does), a cost from a header the log lacks is not evaluated, and a lease
// is replayed as without one, each with a note.
func TestCountAndCostRules(t *testing.T) {
	cfg := `
rules:
  - name: failed_logins
    match: { path: /login }
    limit: 3/15m
    algorithm: fixed_window
    count: { status: [401] }
  - name: tokens
    match: { path: /chat }
    limit: 1000/m
    algorithm: token_bucket
    cost: header:X-Max-Tokens
  - name: hot
    match: { path: /hot }
    limit: 100/m
    algorithm: fixed_window
    lease: 10
`
	line := func(sec, status int, path string) string {
		return fmt.Sprintf("198.51.100.7 - - [23/Nov/2026:09:%02d:%02d +0000] \"POST %s HTTP/1.1\" %d 1 \"-\" \"ua\"\n", sec/60, sec%60, path, status)
	}
	var b strings.Builder
	// Two good logins count nothing; three failures fill the limit; the
	// next two attempts are limited whatever their outcome.
	for i, st := range []int{200, 200, 401, 401, 401, 401, 200} {
		b.WriteString(line(i, st, "/login"))
	}
	b.WriteString(line(10, 200, "/chat"))
	b.WriteString(line(11, 200, "/hot"))
	rep, _ := run(t, cfg, b.String(), Options{})
	fl := ruleOf(t, rep, "failed_logins")
	if fl.Matched != 7 || fl.Limited != 2 {
		t.Fatalf("failed_logins: matched %d limited %d, want 7 and 2", fl.Matched, fl.Limited)
	}
	if len(rep.NotEvaluated) != 1 || rep.NotEvaluated[0].Rule != "tokens" || !strings.Contains(rep.NotEvaluated[0].Reason, "X-Max-Tokens") {
		t.Fatalf("not evaluated: %+v", rep.NotEvaluated)
	}
	if hot := ruleOf(t, rep, "hot"); hot.Matched != 1 || hot.Limited != 0 {
		t.Fatalf("hot: %+v", hot)
	}
	notes := strings.Join(rep.Notes, "\n")
	if !strings.Contains(notes, "local_budget 10 is not replayed") || !strings.Contains(notes, "failed_logins: count") {
		t.Fatalf("notes: %s", notes)
	}
}

// A Caddy line's headers are read in the same order every time, so that
// two spellings of one header give the same value on every run.
func TestCaddyHeadersInOrder(t *testing.T) {
	line := `{"ts":1795424401,"request":{"remote_ip":"198.51.100.1","method":"GET","uri":"/","headers":{"x-api-key":["a"],"X-Api-Key":["b"],"user-agent":["c"],"User-Agent":["d"],"X-B":["e"],"X-A":["f"]}}}`
	var first Record
	for i := 0; i < 50; i++ {
		var rec Record
		if err := caddyFormat(nil).parse(line, &rec); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = rec
		} else if !reflect.DeepEqual(rec, first) {
			t.Fatalf("read %d:\n%+v\nfirst:\n%+v", i, rec, first)
		}
	}
	if first.UA != "c" || len(first.Extra) != 4 || first.Extra[3] != (Header{"X-Api-Key", "a"}) {
		t.Fatalf("%+v", first)
	}
}

package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
)

// exactConfig exercises what the policy does with a request that an
// nginx log records: ip and prefix identities, a header identity, a query
// identity with tiers, a penalty box, a shadow rule, allow and deny lists,
// and all-or-nothing between the rules one request matches.
const exactConfig = `
allow: [192.0.2.200]
deny: [192.0.2.201]
rules:
  - name: login
    match: { methods: [POST], path: /login }
    limit: 3/1m
    algorithm: sliding_log
    block: 2m
  - name: site
    limit: 20/m
    burst: 5
  - name: agents
    match: { path: /api/ }
    identity: ["header:User-Agent"]
    limit: 30/m
    algorithm: fixed_window
  - name: search
    match: { methods: [GET], path: /search }
    identity: [ip/24]
    limit: 5/30s
    algorithm: sliding_window
    shadow: true
  - name: plan
    match: { path: /api/ }
    identity: ["query:user"]
    tiers:
      by: query:plan
      default: { limit: 10/m }
      gold: { limit: 40/m, algorithm: token_bucket }
`

// liveDecision is one rule's decision as the middleware made it, or as
// the replay did.
type liveDecision struct {
	Rule, Identity, Tier    string
	Skipped, Denied, Shadow bool
	Allowed                 bool
	Remaining               int64
	RetryAfter, ResetAfter  time.Duration
}

func decisionOf(rr *policy.RuleResult) liveDecision {
	return liveDecision{rr.Rule, rr.Identity, rr.Tier, rr.Skipped, rr.Denied, rr.Shadow,
		rr.Result.Allowed, rr.Result.Remaining, rr.Result.RetryAfter, rr.Result.ResetAfter}
}

// traffic is a seeded workload: each request's client, method, target,
// user agent and time step.
type trafficReq struct {
	ip, method, target, ua string
	step                   time.Duration
}

func traffic(n int, seed uint64, step func(*rand.Rand) time.Duration) []trafficReq {
	rng := rand.New(rand.NewPCG(seed, 7))
	ips := []string{"198.51.100.1", "198.51.100.2", "198.51.100.3", "203.0.113.9", "203.0.113.10", "192.0.2.200", "192.0.2.201", "2001:db8::1", "2001:db8::2"}
	uas := []string{"curl/8.5.0", "Mozilla/5.0 Firefox/132.0", "python-requests/2.32"}
	targets := []string{"/", "/products/7", "/search?q=a", "/search?q=b", "/api/orders?user=alice", "/api/orders?user=bob&plan=gold", "/api/orders", "/api/x?user=carol&plan=silver"}
	out := make([]trafficReq, n)
	for i := range out {
		r := trafficReq{ip: ips[rng.IntN(len(ips))], method: "GET", target: targets[rng.IntN(len(targets))], ua: uas[rng.IntN(len(uas))], step: step(rng)}
		if rng.IntN(8) == 0 {
			r.method, r.target = "POST", "/login"
		}
		out[i] = r
	}
	return out
}

// runLive drives the requests through policy.Middleware on a memstore
// with a controlled clock, and returns each request's status and rule
// decisions, and the log lines write made of them.
func runLive(t *testing.T, reqs []trafficReq, start time.Time, write func(w *bytes.Buffer, r trafficReq, now time.Time, status int)) (statuses []int, decisions [][]liveDecision, log []byte) {
	t.Helper()
	cfg, err := policy.Parse([]byte(exactConfig), "exact.yaml")
	if err != nil {
		t.Fatal(err)
	}
	now := start
	clock := func() time.Time { return now }
	var cur []liveDecision
	p, err := policy.New(cfg, memstore.New(memstore.WithClock(clock)), policy.WithClock(clock),
		policy.WithObserver(func(_ context.Context, rr policy.RuleResult, _ time.Duration) { cur = append(cur, decisionOf(&rr)) }))
	if err != nil {
		t.Fatal(err)
	}
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	var buf bytes.Buffer
	for _, r := range reqs {
		now = now.Add(r.step)
		req := httptest.NewRequest(r.method, r.target, nil)
		req.RemoteAddr = netJoin(r.ip, "40000")
		req.Header.Set("User-Agent", r.ua)
		rec := httptest.NewRecorder()
		cur = nil
		h.ServeHTTP(rec, req)
		statuses = append(statuses, rec.Code)
		decisions = append(decisions, cur)
		write(&buf, r, now, rec.Code)
	}
	return statuses, decisions, buf.Bytes()
}

func netJoin(ip, port string) string {
	if bytes.IndexByte([]byte(ip), ':') >= 0 {
		return "[" + ip + "]:" + port
	}
	return ip + ":" + port
}

// replayDecisions replays log under exactConfig and returns what runLive
// returns, from the replay's verdicts.
func replayDecisions(t *testing.T, log []byte, o Options) (statuses []int, decisions [][]liveDecision, rep *Report) {
	t.Helper()
	cfg, err := policy.Parse([]byte(exactConfig), "exact.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o.observe = func(_ *Record, _ int, v *policy.Verdict) {
		st := http.StatusOK
		switch {
		case v.AllowListed:
		case v.Denied:
			st = http.StatusForbidden
		case !v.Allowed:
			st = http.StatusTooManyRequests
		}
		statuses = append(statuses, st)
		var ds []liveDecision
		for i := range v.Results {
			ds = append(ds, decisionOf(&v.Results[i]))
		}
		decisions = append(decisions, ds)
	}
	reps, err := Run(context.Background(), []Input{{Name: "log", R: bytes.NewReader(log)}}, []*config.Config{cfg}, o)
	if err != nil {
		t.Fatal(err)
	}
	return statuses, decisions, reps[0]
}

// compareRuns requires the replay to have decided every request as the
// middleware did, and the workload to have exercised every outcome.
func compareRuns(t *testing.T, liveSt, repSt []int, liveD, repD [][]liveDecision) {
	t.Helper()
	if len(liveSt) != len(repSt) {
		t.Fatalf("live made %d decisions, replay %d", len(liveSt), len(repSt))
	}
	count := map[int]int{}
	for i := range liveSt {
		count[liveSt[i]]++
		if liveSt[i] != repSt[i] {
			t.Fatalf("request %d: live status %d, replay %d", i+1, liveSt[i], repSt[i])
		}
		a, _ := json.Marshal(liveD[i])
		b, _ := json.Marshal(repD[i])
		if !bytes.Equal(a, b) {
			t.Fatalf("request %d: decisions differ\nlive:   %s\nreplay: %s", i+1, a, b)
		}
	}
	for _, st := range []int{200, 403, 429} {
		if count[st] < 10 {
			t.Fatalf("the workload gave only %d answers %d (%v): it does not exercise the policy", count[st], st, count)
		}
	}
	t.Logf("statuses: %v", count)
}

// TestExactNginx: requests driven through policy.Middleware at whole
// seconds (nginx's $time_local has no finer precision), several per
// second, logged in nginx's combined format and replayed, get the very
// same decision, rule by rule: status, remaining, retry and reset times.
func TestExactNginx(t *testing.T) {
	start := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	reqs := traffic(4000, 1, func(r *rand.Rand) time.Duration {
		if r.IntN(3) == 0 {
			return time.Second
		}
		return 0
	})
	liveSt, liveD, log := runLive(t, reqs, start, func(w *bytes.Buffer, r trafficReq, now time.Time, status int) {
		fmt.Fprintf(w, "%s - - [%s] \"%s %s HTTP/1.1\" %d 512 \"-\" \"%s\"\n", r.ip, now.In(time.FixedZone("", -7*3600)).Format("02/Jan/2006:15:04:05 -0700"), r.method, r.target, status, r.ua)
	})
	repSt, repD, rep := replayDecisions(t, log, Options{Format: FormatNginx})
	if rep.Format != "nginx combined" || rep.Skipped != 0 || rep.Lines != int64(len(reqs)) {
		t.Fatalf("report: format %q, %d lines, %d skipped", rep.Format, rep.Lines, rep.Skipped)
	}
	compareRuns(t, liveSt, repSt, liveD, repD)
}

// TestExactMicroseconds: the same at microsecond resolution, through JSON
// lines whose timestamps carry it.
func TestExactMicroseconds(t *testing.T) {
	start := time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)
	reqs := traffic(4000, 2, func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(700_000)) * time.Microsecond })
	liveSt, liveD, log := runLive(t, reqs, start, func(w *bytes.Buffer, r trafficReq, now time.Time, status int) {
		line, _ := json.Marshal(map[string]any{"ts": now.Format(time.RFC3339Nano), "client": r.ip, "req": map[string]any{"method": r.method, "uri": r.target}, "ua": r.ua, "status": status})
		w.Write(append(line, '\n'))
	})
	fields := map[string]string{"time": "ts", "ip": "client", "method": "req.method", "uri": "req.uri", "header:User-Agent": "ua", "status": "status"}
	repSt, repD, _ := replayDecisions(t, log, Options{Format: FormatJSONL, Fields: fields})
	compareRuns(t, liveSt, repSt, liveD, repD)
}

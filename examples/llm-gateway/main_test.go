package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

var discardLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestOpenAIJSONSettles: the estimate (body bytes at the input price,
// max_tokens at the higher of the output and reasoning prices) is taken
// before the request goes upstream; the usage, its cached tokens at the
// cached price and its reasoning tokens at the reasoning price, settles it.
func TestOpenAIJSONSettles(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 300, Cached: 700, Out: 200, Reasoning: 50}
	b := body("gpt-t", 800, x, "")
	status, resp, h := g.do(chatPath, "sk-a", b)
	if status != 200 || !strings.Contains(resp, `"cached_tokens":700`) {
		t.Fatalf("completion: %d %s", status, resp)
	}
	est := estimateOf("gpt-t", len(b), 800)
	if got, want := h.Get("RateLimit"), fmt.Sprintf(`"key-budget";r=%d;`, keyBudget-est); !strings.Contains(got, want) {
		t.Fatalf("RateLimit %q, want %s (the estimate %d taken)", got, want, est)
	}
	// 300×2 + 700×0.5 + 200×10 + 50×12 micro-units.
	if got, want := g.keyLeft("sk-a"), int64(keyBudget-(600+350+2000+600)); got != want || costOf("gpt-t", x) != 3550 {
		t.Fatalf("left %d, want %d", got, want)
	}
	if up.sawWeirHeader.Load() {
		t.Fatal("an X-Weir-* header went upstream")
	}
}

// TestOpenAIStreamUsage: a streamed completion passes through event by
// event; the gateway asks for the usage chunk and settles it.
func TestOpenAIStreamUsage(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 1000, Cached: 4000, Out: 900, Reasoning: 1100, Wait: true}
	resp := g.post(context.Background(), chatPath, "sk-b", body("gpt-t", 3000, x, `"stream":true`))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	if first, err := br.ReadString('\n'); err != nil || !strings.Contains(first, "tok0") {
		t.Fatalf("first event: %q %v", first, err)
	}
	close(up.release) // the usage comes only now, at the end
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	g.served.Wait()
	if !strings.Contains(string(rest), `"reasoning_tokens":1100`) || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("rest of the stream: %s", rest)
	}
	if !up.sawIncludeUsage.Load() {
		t.Fatal("the gateway did not ask for the stream's usage")
	}
	if got, want := g.keyLeft("sk-b"), keyBudget-costOf("gpt-t", x); got != want {
		t.Fatalf("left %d, want %d", got, want)
	}
}

// TestAnthropicUsage: a message's usage, from JSON or split across a
// stream's message_start (input, cache writes and reads) and
// message_delta (the final output count), is settled at the model's
// prices: cache writes at the cache write price, cache reads as cached
// input. Text in the stream that looks like a usage is not one. A key is
// read from x-api-key.
func TestAnthropicUsage(t *testing.T) {
	up := newFakeUpstream(t)
	close(up.release)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 120, CacheW: 500, Cached: 3000, Out: 777}
	want := ceilDiv(120*cIn+500*cWrite+3000*cCached+777*cOut, 1_000_000)
	for _, c := range []struct{ key, extra string }{{"sk-ant-json", ""}, {"sk-ant-sse", `"stream":true`}} {
		b := body("claude-t", 1000, x, c.extra)
		status, resp, h := g.do(messagesPath, "", b, "X-Api-Key", c.key, "Anthropic-Version", "2023-06-01")
		if status != 200 {
			t.Fatalf("%s: %d %s", c.key, status, resp)
		}
		if est := estimateOf("claude-t", len(b), 1000); !strings.Contains(h.Get("RateLimit"), fmt.Sprintf("r=%d;", keyBudget-est)) {
			t.Fatalf("%s: RateLimit %q, want the estimate %d taken", c.key, h.Get("RateLimit"), est)
		}
		if got := g.keyLeft(c.key); got != keyBudget-want || costOf("claude-t", x) != want {
			t.Fatalf("%s: left %d, want %d", c.key, got, keyBudget-want)
		}
	}
}

// TestAnthropicCacheWriteDefault: a model whose prices give no
// cache_write prices its cache writes at its input price, in JSON and in
// a stream, and its estimate is as without cache writes.
func TestAnthropicCacheWriteDefault(t *testing.T) {
	up := newFakeUpstream(t)
	close(up.release)
	rules := strings.Replace(testRules, "    claude-t:", "    claude-d: {input: 3, output: 15}\n    claude-t:", 1)
	g := newTestGateway(t, up, rules, nil, time.Minute)
	x := knobs{In: 7, CacheW: 1001, Out: 10}
	want := ceilDiv(7*3_000_000+1001*3_000_000+10*15_000_000, 1_000_000)
	for _, c := range []struct{ key, extra string }{{"sk-d-json", ""}, {"sk-d-sse", `"stream":true`}} {
		b := body("claude-d", 100, x, c.extra)
		status, resp, h := g.do(messagesPath, "", b, "X-Api-Key", c.key, "Anthropic-Version", "2023-06-01")
		if status != 200 {
			t.Fatalf("%s: %d %s", c.key, status, resp)
		}
		if est := ceilDiv(int64(len(b))*3_000_000+100*15_000_000, 1_000_000); !strings.Contains(h.Get("RateLimit"), fmt.Sprintf("r=%d;", keyBudget-est)) {
			t.Fatalf("%s: RateLimit %q, want the estimate %d taken", c.key, h.Get("RateLimit"), est)
		}
		if got := g.keyLeft(c.key); got != keyBudget-want {
			t.Fatalf("%s: left %d, want %d (cache writes at the input price)", c.key, got, keyBudget-want)
		}
	}
}

// TestNoUsageChargesEstimate: a 200 without a usage, an OpenAI stream
// without its usage chunk, and an Anthropic stream cut after
// message_start (its output count never came) keep the whole estimate.
func TestNoUsageChargesEstimate(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	for _, c := range []struct {
		key, path, model string
		x                knobs
		extra            string
	}{
		{"sk-1", chatPath, "gpt-t", knobs{In: 5, Out: 5, NoUsage: true}, ""},
		{"sk-2", chatPath, "gpt-t", knobs{In: 5, Out: 5, NoUsage: true}, `"stream":true,"stream_options":{"include_usage":true}`},
		{"sk-3", messagesPath, "claude-t", knobs{In: 5, Out: 5, NoUsage: true}, ""},
		{"sk-4", messagesPath, "claude-t", knobs{In: 5, Out: 5, Cut: true}, `"stream":true`},
		{"sk-5", messagesPath, "claude-t", knobs{In: 5, Out: 5, NoUsage: true}, `"stream":true`},
	} {
		b := body(c.model, 500, c.x, c.extra)
		status, resp, _ := g.do(c.path, c.key, b)
		if status != 200 {
			t.Fatalf("%s: %d %s", c.key, status, resp)
		}
		if got, want := g.keyLeft(c.key), keyBudget-estimateOf(c.model, len(b), 500); got != want {
			t.Errorf("%s: left %d, want %d (the whole estimate)", c.key, got, want)
		}
	}
}

// TestUpstreamErrors: an upstream 4xx without a usage is refunded (the
// provider bills nothing); a 5xx, or no upstream at all, keeps the whole
// estimate.
func TestUpstreamErrors(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	for _, c := range []struct {
		key    string
		status int
		full   bool
	}{{"sk-400", 400, false}, {"sk-429", 429, false}, {"sk-500", 500, true}, {"sk-529", 529, true}} {
		b := body("gpt-t", 500, knobs{Status: c.status}, "")
		status, _, _ := g.do(chatPath, c.key, b)
		want := int64(keyBudget)
		if c.full {
			want -= estimateOf("gpt-t", len(b), 500)
		}
		if got := g.keyLeft(c.key); status != c.status || got != want {
			t.Errorf("%s: %d, left %d, want %d", c.key, status, got, want)
		}
	}
	up.Close()
	b := body("gpt-t", 500, knobs{}, "")
	if status, _, _ := g.do(chatPath, "sk-down", b); status != http.StatusBadGateway || g.keyLeft("sk-down") != keyBudget-estimateOf("gpt-t", len(b), 500) {
		t.Errorf("no upstream: %d, left %d", status, g.keyLeft("sk-down"))
	}
}

// TestUnknownModel: a model the table does not list is a 400 naming it,
// and nothing is taken; under prices.unknown it is priced at those prices.
func TestUnknownModel(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	status, resp, _ := g.do(chatPath, "sk-u", body("gpt-9-secret-preview", 10, knobs{}, ""))
	if status != 400 || !strings.Contains(errorMessage([]byte(resp)), `unknown model "gpt-9-secret-preview"`) || g.keyLeft("sk-u") != keyBudget {
		t.Fatalf("unknown model: %d %s, left %d", status, resp, g.keyLeft("sk-u"))
	}
	rules := strings.Replace(testRules, "unknown: refuse", "unknown: {input: 2, output: 10, reasoning: 12, cached_input: 0.5}", 1)
	g = newTestGateway(t, up, rules, nil, time.Minute)
	x := knobs{In: 10, Out: 10}
	if status, resp, _ := g.do(chatPath, "sk-u", body("gpt-9", 10, x, "")); status != 200 || g.keyLeft("sk-u") != keyBudget-costOf("gpt-t", x) {
		t.Fatalf("unknown model at the default prices: %d %s, left %d", status, resp, g.keyLeft("sk-u"))
	}
}

// TestHierarchy: a key's user, team and organisation come from the
// tenants file; every level is charged the same settlement, and a level
// out of budget refuses the request with 429 naming it, taking nothing
// from the others.
func TestHierarchy(t *testing.T) {
	up := newFakeUpstream(t)
	ts := tenants{
		keyID("sk-alice-1"): {User: "alice", Team: "search", Org: "acme"},
		keyID("sk-alice-2"): {User: "alice", Team: "search", Org: "acme"},
		keyID("sk-bob"):     {Team: "search", Org: "acme"},
	}
	g := newTestGateway(t, up, "", ts, time.Minute)
	x1, x2 := knobs{In: 1000, Out: 1000}, knobs{In: 1000, Out: 7000}
	c1, c2 := costOf("gpt-t", x1), costOf("gpt-t", x2) // 0.012 and 0.072 USD
	// A client's own level headers are dropped.
	for _, r := range []struct {
		key string
		max int64
		x   knobs
	}{{"sk-alice-1", 1000, x1}, {"sk-alice-2", 7000, x2}} {
		if status, resp, _ := g.do(chatPath, r.key, body("gpt-t", r.max, r.x, ""), "X-Weir-Team", "other", "X-Weir-User", "mallory"); status != 200 {
			t.Fatalf("%s: %d %s", r.key, status, resp)
		}
	}
	for _, l := range []struct {
		rule, id string
		want     int64
	}{
		{"key-budget", keyID("sk-alice-1"), 100_000 - c1},
		{"key-budget", keyID("sk-alice-2"), 100_000 - c2},
		{"user-budget", "alice", 150_000 - c1 - c2},
		{"team-budget", "search", 500_000 - c1 - c2},
		{"org-budget", "acme", 1_000_000 - c1 - c2},
		{"team-budget", "other", 500_000},
		{"user-budget", "mallory", 150_000},
	} {
		if got := g.left(l.rule, l.id); got != l.want {
			t.Errorf("%s %s: left %d, want %d", l.rule, l.id, got, l.want)
		}
	}
	// alice's user budget has 0.066 USD left, her first key 0.088: an
	// estimate of about 0.072 fits the key's budget, not the user's.
	status, resp, h := g.do(chatPath, "sk-alice-1", body("gpt-t", 6000, x1, ""))
	if status != 429 || !strings.Contains(resp, "user-budget") || h.Get("Retry-After") == "" {
		t.Fatalf("alice over her user budget: %d %s %v", status, resp, h)
	}
	if got := g.keyLeft("sk-alice-1"); got != 100_000-c1 || g.left("team-budget", "search") != 500_000-c1-c2 {
		t.Fatalf("a refused request took from another level: key left %d", got)
	}
	// A key the file does not list is charged at the key level only, or
	// refused under UNLISTED_KEYS=refuse.
	if status, _, _ := g.do(chatPath, "sk-stranger", body("gpt-t", 7000, x2, "")); status != 200 || g.keyLeft("sk-stranger") != 100_000-c2 || g.left("org-budget", "acme") != 1_000_000-c1-c2 {
		t.Fatalf("an unlisted key: %d", status)
	}
	g.h.listed.Store(true)
	if status, resp, _ := g.do(chatPath, "sk-stranger2", body("gpt-t", 7000, x2, "")); status != 403 || !strings.Contains(resp, "not in the gateway's tenants file") || g.keyLeft("sk-stranger2") != 100_000 {
		t.Fatalf("an unlisted key under refuse: %d %s", status, resp)
	}
	// bob has no user level: his key, team and organisation are charged.
	if status, _, _ := g.do(chatPath, "sk-bob", body("gpt-t", 7000, x2, "")); status != 200 || g.left("team-budget", "search") != 500_000-c1-2*c2 || g.left("org-budget", "acme") != 1_000_000-c1-2*c2 {
		t.Fatalf("bob: %d, team left %d", status, g.left("team-budget", "search"))
	}
}

// TestHangUpChargesUpstreamUsage: a client that hangs up before the usage
// does not stop the metering, in either format: the gateway reads on and
// charges the upstream's usage, not the estimate.
func TestHangUpChargesUpstreamUsage(t *testing.T) {
	for _, c := range []struct{ path, model string }{{chatPath, "gpt-t"}, {messagesPath, "claude-t"}} {
		up := newFakeUpstream(t)
		g := newTestGateway(t, up, "", nil, time.Minute)
		ctx, cancel := context.WithCancel(context.Background())
		x := knobs{In: 600, Out: 4000, Wait: true}
		resp := g.post(ctx, c.path, "sk-c", body(c.model, 5000, x, `"stream":true`))
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
		deadline := time.Now().Add(10 * time.Second)
		for g.hangUps.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if g.hangUps.Load() == 0 {
			t.Fatal("the gateway never saw the client go away")
		}
		select {
		case <-up.canceled:
			t.Fatal("the gateway cancelled the upstream request")
		case <-time.After(100 * time.Millisecond):
		}
		close(up.release)
		g.served.Wait()
		if got, want := g.keyLeft("sk-c"), keyBudget-costOf(c.model, x); got != want {
			t.Fatalf("%s: left %d, want %d (the usage)", c.path, got, want)
		}
	}
}

// TestHangUpStalledChargesEstimate: when the usage does not come within
// the drain bound after the client hangs up, the whole estimate is kept.
func TestHangUpStalledChargesEstimate(t *testing.T) {
	up := newFakeUpstream(t)
	defer close(up.release)
	g := newTestGateway(t, up, "", nil, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	b := body("claude-t", 700, knobs{In: 5, Out: 5, Wait: true}, `"stream":true`)
	resp := g.post(ctx, messagesPath, "sk-s", b)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	<-up.canceled
	g.served.Wait()
	if got, want := g.keyLeft("sk-s"), keyBudget-estimateOf("claude-t", len(b), 700); got != want {
		t.Fatalf("left %d, want %d", got, want)
	}
}

// TestOversized: usage after 2 MiB of JSON or in a 2 MiB stream event is
// still read, in both formats; a usage object over 64 KiB is not (the
// estimate stays); a request body over 1 MiB is a 413, nothing taken.
func TestOversized(t *testing.T) {
	up := newFakeUpstream(t)
	close(up.release)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 100, Out: 100, Pad: 2 << 20}
	for i, c := range []struct{ path, model, extra string }{
		{chatPath, "gpt-t", ""}, {chatPath, "gpt-t", `"stream":true`},
		{messagesPath, "claude-t", ""}, {messagesPath, "claude-t", `"stream":true`},
	} {
		key := fmt.Sprintf("sk-big-%d", i)
		status, resp, _ := g.do(c.path, key, body(c.model, 100, x, c.extra))
		if status != 200 || len(resp) < 2<<20 {
			t.Fatalf("%s %s: %d, %d bytes", c.path, c.extra, status, len(resp))
		}
		if got, want := g.keyLeft(key), keyBudget-costOf(c.model, x); got != want {
			t.Errorf("%s %s: left %d, want %d", c.path, c.extra, got, want)
		}
	}
	status, _, _ := g.do(chatPath, "sk-huge", body("gpt-t", 1, knobs{}, `"pad":"`+strings.Repeat("a", maxBody)+`"`))
	if status != http.StatusRequestEntityTooLarge || g.keyLeft("sk-huge") != keyBudget {
		t.Fatalf("a body over 1 MiB: %d, left %d", status, g.keyLeft("sk-huge"))
	}
	var s usageScanner
	s.write([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":1,"pad":"` + strings.Repeat("x", maxUsage) + `"}}`))
	if s.found || cap(s.value) > 2*maxUsage {
		t.Fatalf("an over-long usage: found %t, kept %d bytes", s.found, cap(s.value))
	}
}

// TestGzipClientUsage: a client that accepts gzip is still charged the
// usage: the answer is compressed only between the upstream and the gateway.
func TestGzipClientUsage(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 10, Out: 130}
	g.client.Transport.(*http.Transport).DisableCompression = true
	status, _, _ := g.do(chatPath, "sk-z", body("gpt-t", 800, x, ""), "Accept-Encoding", "gzip")
	if status != 200 || g.keyLeft("sk-z") != keyBudget-costOf("gpt-t", x) {
		t.Fatalf("%d, left %d", status, g.keyLeft("sk-z"))
	}
}

// TestUsageOverEstimate: a usage over its estimate (an upstream that did
// not honour max_tokens) is charged in full: the key passes its budget by
// at most that request's excess, and is refused until its period ends.
func TestUsageOverEstimate(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 100, Out: 12_000}
	b := body("gpt-t", 8000, x, "")
	est, c := estimateOf("gpt-t", len(b), 8000), costOf("gpt-t", x)
	if status, resp, _ := g.do(chatPath, "sk-o", b); status != 200 {
		t.Fatalf("%d %s", status, resp)
	}
	// The estimate fit the budget, the usage passes it: by c − budget,
	// less than the request's excess c − est.
	if est > keyBudget || c <= keyBudget {
		t.Fatalf("the test's figures: estimate %d, usage %d, budget %d", est, c, keyBudget)
	}
	if got := g.keyLeft("sk-o"); got != 0 {
		t.Fatalf("left %d after a usage of %d over the budget", got, c)
	}
	status, resp, h := g.do(chatPath, "sk-o", body("gpt-t", 0, knobs{}, ""))
	if status != 429 || !strings.Contains(resp, "key-budget") || h.Get("Retry-After") == "" {
		t.Fatalf("a key over its budget: %d %s", status, resp)
	}
	// The next day, a new window, the key is admitted again.
	g.clock.Advance(24 * time.Hour)
	if status, _, _ := g.do(chatPath, "sk-o", body("gpt-t", 0, knobs{}, "")); status != 200 {
		t.Fatalf("the next day: %d", status)
	}
}

// TestBudgetResetsInZone: a calendar budget resets at the start of its
// period in its time zone: a key that spent its New York day is refused
// until New York's midnight (05:00 UTC in winter), not UTC's, and then
// admitted with the whole budget.
func TestBudgetResetsInZone(t *testing.T) {
	up := newFakeUpstream(t)
	close(up.release)
	g := newTestGateway(t, up, testPrices+`
rules:
  - {name: key-budget, identity: header:X-Weir-Key, on_missing: deny, budget: 0.05 USD/day, timezone: America/New_York}
`, nil, time.Minute)
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	g.clock.Set(time.Date(2030, 1, 14, 18, 0, 0, 0, ny)) // 23:00 UTC on the 14th
	x := knobs{In: 100, Out: 900}
	b := body("gpt-t", 1000, x, "")
	admitted := 0
	for {
		status, resp, _ := g.do(chatPath, "sk-ny", b)
		if status == 429 {
			break
		}
		if status != 200 {
			t.Fatalf("%d %s", status, resp)
		}
		if admitted++; admitted > 100 {
			t.Fatal("the budget never bound")
		}
	}
	if admitted == 0 {
		t.Fatal("the first request was refused")
	}
	// Past UTC's midnight, and a microsecond before New York's: refused.
	for _, at := range []time.Time{time.Date(2030, 1, 15, 0, 30, 0, 0, time.UTC), time.Date(2030, 1, 14, 23, 59, 59, 999_999_000, ny)} {
		g.clock.Set(at)
		if status, resp, _ := g.do(chatPath, "sk-ny", b); status != 429 {
			t.Fatalf("at %v: %d %s", at, status, resp)
		}
	}
	g.clock.Set(time.Date(2030, 1, 15, 0, 0, 0, 0, ny))
	if got := g.keyLeft("sk-ny"); got != 50_000 {
		t.Fatalf("at New York's midnight %d left, want the whole 50000", got)
	}
	if status, resp, _ := g.do(chatPath, "sk-ny", b); status != 200 {
		t.Fatalf("after New York's midnight: %d %s", status, resp)
	}
}

// failingWriter is a client that went away after the first write: every
// later write fails, as on a connection the client reset.
type failingWriter struct {
	h      http.Header
	writes int
}

func (f *failingWriter) Header() http.Header { return f.h }
func (f *failingWriter) WriteHeader(int)     {}
func (f *failingWriter) Flush()              {}
func (f *failingWriter) Write(p []byte) (int, error) {
	if f.writes++; f.writes > 1 {
		return 0, errors.New("connection reset by peer")
	}
	return len(p), nil
}

// TestWriteErrorStillSettles: when writing a stream to a client that went
// away fails, the reverse proxy aborts the handler (a panic with
// http.ErrAbortHandler, as under a real server); the gateway still reads
// the answer's usage and settles it, rather than keeping the estimate.
func TestWriteErrorStillSettles(t *testing.T) {
	up := newFakeUpstream(t)
	close(up.release)
	g := newTestGateway(t, up, "", nil, time.Minute)
	for _, c := range []struct{ path, model, key string }{{chatPath, "gpt-t", "sk-w1"}, {messagesPath, "claude-t", "sk-w2"}} {
		x := knobs{In: 600, Out: 4000}
		r := httptest.NewRequest("POST", c.path, strings.NewReader(body(c.model, 5000, x, `"stream":true`)))
		r.Header.Set("Authorization", "Bearer "+c.key)
		r = r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, &http.Server{}))
		func() {
			defer func() {
				if p := recover(); p != nil && p != http.ErrAbortHandler {
					panic(p)
				}
			}()
			g.h.ServeHTTP(&failingWriter{h: http.Header{}}, r)
		}()
		if got, want := g.keyLeft(c.key), keyBudget-costOf(c.model, x); got != want {
			t.Errorf("%s: left %d, want %d (the usage, not the estimate)", c.path, got, want)
		}
	}
}

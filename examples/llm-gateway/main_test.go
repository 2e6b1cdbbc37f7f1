package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// fakeUpstream is an OpenAI-style chat API: it answers JSON with a usage,
// or streams server-sent events, one per chunk with a flush between, and
// ends with a usage event when include_usage was asked for. The usage it
// reports is the request's "x_usage" field (a test knob).
type fakeUpstream struct {
	*httptest.Server
	sawIncludeUsage atomic.Bool
	sawCostHeader   atomic.Bool
	sawKeyHeader    atomic.Bool
	bodyLen         atomic.Int64  // the size of the last request body
	release         chan struct{} // a stream waits on it before its usage event; nil: no wait
	canceled        chan struct{} // closed when the gateway cancels a stream waiting on release
	cancelOnce      sync.Once
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	f := &fakeUpstream{canceled: make(chan struct{})}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(costHeader) != "" {
			f.sawCostHeader.Store(true)
		}
		if r.Header.Get(keyHeader) != "" {
			f.sawKeyHeader.Store(true)
		}
		body, _ := io.ReadAll(r.Body)
		f.bodyLen.Store(int64(len(body)))
		var req struct {
			Stream        bool `json:"stream"`
			XUsage        int64
			XPad          int  // bytes of content before the usage
			XNoUsage      bool // answer without a usage
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		pad := strings.Repeat("x", req.XPad)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				defer zw.Close()
				w = gzipWriter{w, zw}
			}
			if req.XNoUsage {
				fmt.Fprintf(w, `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi%s"}}]}`, pad)
				return
			}
			fmt.Fprintf(w, `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi%s"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, pad, req.XUsage-5, req.XUsage)
			return
		}
		f.sawIncludeUsage.Store(req.StreamOptions.IncludeUsage)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		if f.release != nil {
			select {
			case <-f.release:
			case <-r.Context().Done():
				f.cancelOnce.Do(func() { close(f.canceled) })
				return
			}
		}
		if req.StreamOptions.IncludeUsage && !req.XNoUsage {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%s\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", pad, req.XUsage-5, req.XUsage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.Close)
	return f
}

// gzipWriter writes a response's body through a gzip.Writer.
type gzipWriter struct {
	http.ResponseWriter
	zw *gzip.Writer
}

func (g gzipWriter) Write(b []byte) (int, error) { return g.zw.Write(b) }

type testGateway struct {
	t       *testing.T
	p       *policy.Policy
	clock   *storetest.Clock
	url     string
	hangUps atomic.Int64 // requests whose client went away while the gateway served them
}

func newTestGateway(t *testing.T, up *fakeUpstream) *testGateway {
	return newTestGatewayDrain(t, up, time.Minute)
}

// newTestGatewayDrain is newTestGateway reading on for drain after a
// client hangs up.
func newTestGatewayDrain(t *testing.T, up *fakeUpstream, drain time.Duration) *testGateway {
	clock := storetest.NewClock(storetest.Epoch)
	p, err := newPolicy(memstore.New(memstore.WithClock(clock.Now)))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.URL)
	h, err := newGateway(p, u, drain)
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{t: t, p: p, clock: clock}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		stop := context.AfterFunc(r.Context(), func() { g.hangUps.Add(1) })
		h.ServeHTTP(w, r)
		stop()
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

// chat posts a completion request for key.
func (g *testGateway) chat(ctx context.Context, key string, body string) *http.Response {
	g.t.Helper()
	return g.chatAuth(ctx, "Bearer "+key, body)
}

// chatAuth posts a completion request with the Authorization header auth.
func (g *testGateway) chatAuth(ctx context.Context, auth string, body string) *http.Response {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", g.url+"/v1/chat/completions", strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(costHeader, "1") // a client cannot choose its own cost
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp
}

// remaining peeks at key's tokens.
func (g *testGateway) remaining(key string) int64 {
	g.t.Helper()
	rr, err := g.p.CheckKey(context.Background(), policy.KeyRequest{Rule: "llm-tokens", Key: keyID(key), N: 0})
	if err != nil {
		g.t.Fatal(err)
	}
	return rr.Result.Remaining
}

// TestJSONUsageSettles: the body's bytes plus max_tokens are reserved,
// usage.total_tokens charged.
func TestJSONUsageSettles(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	body := `{"model":"m","max_tokens":800,"XUsage":130,"messages":[]}`
	resp := g.chat(context.Background(), "sk-a", body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"total_tokens":130`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	// The reservation shows in the response's headers: 10000 − 800 − the body's bytes.
	if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf("r=%d;", 10000-800-len(body)); !strings.Contains(got, want) {
		t.Fatalf("RateLimit header %q, want %s (800 + %d reserved)", got, want, len(body))
	}
	waitRemaining(t, g, "sk-a", 9870) // 130 charged, 670 of the 800 given back
	if up.sawCostHeader.Load() {
		t.Fatal("the cost header went upstream")
	}
}

// TestStreamUsageSettlesIntoDebt: a streamed completion passes through
// event by event; its usage event (asked for by the gateway) is charged,
// here past the budget, and the key then gets 429 with the standard
// headers until its debt is paid back.
func TestStreamUsageSettlesIntoDebt(t *testing.T) {
	up := newFakeUpstream(t)
	up.release = make(chan struct{})
	g := newTestGateway(t, up)
	resp := g.chat(context.Background(), "sk-b", `{"model":"m","stream":true,"max_tokens":100,"XUsage":12000,"messages":[]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	// The first events arrive before the upstream has finished: streamed.
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, "tok0") {
		t.Fatalf("first event: %q %v", first, err)
	}
	close(up.release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if !strings.Contains(string(rest), `"total_tokens":12000`) || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("rest of the stream: %s", rest)
	}
	if !up.sawIncludeUsage.Load() {
		t.Fatal("the gateway did not ask for the stream's usage")
	}
	// 12000 used of 10000: 2000 in debt. The next request is refused.
	waitRemaining(t, g, "sk-b", 0)
	small := `{"model":"m","max_tokens":1,"XUsage":1,"messages":[]}`
	resp = g.chat(context.Background(), "sk-b", small)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The 2000 of debt and this request's 1 + 53 bytes: 2054 tokens at 6ms each,
	// 12.324s, so Retry-After 13.
	if len(small) != 53 {
		t.Fatalf("the small request has %d bytes, want 53", len(small))
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "13" || !strings.Contains(resp.Header.Get("RateLimit"), `"llm-tokens";r=0`) || !strings.Contains(string(b), "llm-tokens") {
		t.Fatalf("a key in debt: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	g.clock.Advance(2054 * 6 * time.Millisecond)
	resp = g.chat(context.Background(), "sk-b", small)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("once the debt is paid: %d", resp.StatusCode)
	}
	// Another key was never affected.
	if got := g.remaining("sk-other"); got != 10000 {
		t.Fatalf("another key: %d", got)
	}
}

// waitRemaining waits (generously) for the settlement, which runs when the
// proxy's handler returns, just after the client read the last byte.
func waitRemaining(t *testing.T, g *testGateway, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.remaining(key) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d tokens remain, want %d", key, g.remaining(key), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBadInputs: a request without an API key is refused (on_missing:
// deny), and a max_tokens over what the budget can ever admit is a 400.
func TestBadInputs(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	req, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(`{"max_tokens":5}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("no API key: %d", resp.StatusCode)
	}
	resp = g.chat(context.Background(), "sk-d", `{"model":"m","max_tokens":20000,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "20000") {
		t.Fatalf("max_tokens over the budget: %d %s", resp.StatusCode, b)
	}
}

// prompt returns a chat request body whose one message holds size bytes,
// with the fields extra (a JSON fragment such as "max_tokens":1).
func prompt(size int, extra string) string {
	return fmt.Sprintf(`{"model":"m",%s,"messages":[{"role":"user","content":"%s"}]}`, extra, strings.Repeat("a", size))
}

// TestEstimateBoundsPrompt: the reservation is the request body's bytes
// (a bound on the prompt's tokens) plus max_tokens × n, at most the whole
// budget; the usage is charged after.
func TestEstimateBoundsPrompt(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	body := prompt(5000, `"max_tokens":100,"n":3,"XUsage":500`)
	resp := g.chat(context.Background(), "sk-p", body)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf("r=%d;", 10000-len(body)-300); resp.StatusCode != 200 || !strings.Contains(got, want) {
		t.Fatalf("%d, RateLimit header %q, want %s (%d bytes + 100 × 3 reserved)", resp.StatusCode, got, want, len(body))
	}
	waitRemaining(t, g, "sk-p", 9500)

	// A prompt larger than the budget reserves the whole budget, not a 400.
	resp = g.chat(context.Background(), "sk-q", prompt(12000, `"max_tokens":10,"XUsage":3010`))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := resp.Header.Get("RateLimit"); resp.StatusCode != 200 || !strings.Contains(got, "r=0;") {
		t.Fatalf("%d, RateLimit header %q, want r=0 (the whole budget reserved)", resp.StatusCode, got)
	}
	waitRemaining(t, g, "sk-q", 10000-3010)
}

// TestHangUpChargesUpstreamUsage: a client that hangs up before the usage
// event does not stop the metering. The gateway reads on and charges the
// upstream's usage: a 6,000-byte prompt with max_tokens 1 costs what the
// upstream reports, not 1.
func TestHangUpChargesUpstreamUsage(t *testing.T) {
	up := newFakeUpstream(t)
	up.release = make(chan struct{})
	g := newTestGateway(t, up)
	ctx, cancel := context.WithCancel(context.Background())
	resp := g.chat(ctx, "sk-c", prompt(6000, `"stream":true,"max_tokens":1,"XUsage":6001`))
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	// The upstream finishes once the gateway has seen the client go away
	// (and, had it cancelled the upstream request, once the upstream saw that).
	deadline := time.Now().Add(10 * time.Second)
	for g.hangUps.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g.hangUps.Load() == 0 {
		t.Fatal("the gateway never saw the client go away")
	}
	select {
	case <-up.canceled:
	case <-time.After(200 * time.Millisecond):
	}
	close(up.release)
	waitRemaining(t, g, "sk-c", 10000-6001)
}

// TestHangUpStalledChargesEstimate: when the upstream's usage does not
// come within the drain bound after the client hangs up, the whole
// estimate (body bytes + max_tokens) is charged.
func TestHangUpStalledChargesEstimate(t *testing.T) {
	up := newFakeUpstream(t)
	up.release = make(chan struct{})
	defer close(up.release)
	g := newTestGatewayDrain(t, up, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	resp := g.chat(ctx, "sk-s", prompt(3000, `"stream":true,"max_tokens":700,"XUsage":50`))
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitRemaining(t, g, "sk-s", 10000-700-up.bodyLen.Load())
}

// TestGzipClientUsage: a client that accepts gzip (as OpenAI's SDKs do)
// is still charged the usage, not the whole estimate: the upstream's
// answer is compressed only between it and the gateway.
func TestGzipClientUsage(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	req, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":800,"XUsage":130,"messages":[]}`))
	req.Header.Set("Authorization", "Bearer sk-z")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
	waitRemaining(t, g, "sk-z", 10000-130)
}

// TestUsageOfLargeJSONBody: a completion over 1 MB is charged its usage.
func TestUsageOfLargeJSONBody(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	resp := g.chat(context.Background(), "sk-l", `{"model":"m","max_tokens":100,"XUsage":9000,"XPad":2097152,"messages":[]}`)
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || n < 2<<20 {
		t.Fatalf("completion: %d, %d bytes", resp.StatusCode, n)
	}
	waitRemaining(t, g, "sk-l", 1000)
}

// TestUsageInLargeStreamEvent: a stream event over 1 MB that carries the
// usage is charged it.
func TestUsageInLargeStreamEvent(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	resp := g.chat(context.Background(), "sk-e", `{"model":"m","stream":true,"max_tokens":100,"XUsage":9000,"XPad":2097152,"messages":[]}`)
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || n < 2<<20 {
		t.Fatalf("stream: %d, %d bytes", resp.StatusCode, n)
	}
	waitRemaining(t, g, "sk-e", 1000)
}

// TestNoUsageChargesEstimate: a completion without a usage, or a stream
// that ends without one, is charged the whole estimate.
func TestNoUsageChargesEstimate(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	for _, key := range []string{"sk-j", "sk-k"} {
		stream := key == "sk-k"
		resp := g.chat(context.Background(), key, fmt.Sprintf(`{"model":"m","stream":%t,"max_tokens":500,"XNoUsage":true,"messages":[]}`, stream))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", key, resp.StatusCode)
		}
		waitRemaining(t, g, key, 10000-500-up.bodyLen.Load())
	}
}

// TestAPIKeyIsCanonical: the scheme's case and the spaces around it do not
// make another budget; the key's case does; a malformed Authorization is
// a 401 that does not echo the key; a client cannot name its own budget.
func TestAPIKeyIsCanonical(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	body := `{"model":"m","max_tokens":4000,"XUsage":4000,"messages":[]}`
	for i, auth := range []string{"Bearer sk-Same", "bearer sk-Same", "BEARER \t sk-Same"} {
		resp := g.chatAuth(context.Background(), auth, body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// One budget: two reservations of 4000 + the body leave less than a third.
		want := 200
		if i == 2 {
			want = 429
		}
		if resp.StatusCode != want {
			t.Fatalf("%q: %d, want %d", auth, resp.StatusCode, want)
		}
	}
	resp := g.chatAuth(context.Background(), "Bearer SK-SAME", body)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("another key (its case differs): %d", resp.StatusCode)
	}
	if up.sawKeyHeader.Load() {
		t.Fatal("the key header went upstream")
	}

	for _, c := range []struct{ auth, want string }{
		{"Bearer", "no space"},
		{"sk-secret-1", "no space"},
		{"Basic sk-secret-1", `"Basic" is not Bearer`},
		{"Bearer sk-secret-1 sk-secret-2", `' ' at byte 11`},
		{"Bearer sk-secret-1,x", `',' at byte 11`},
		{"Bearer ==", "empty"},
	} {
		resp := g.chatAuth(context.Background(), c.auth, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(errorMessage(b), c.want) || strings.Contains(string(b), "secret") || resp.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%q: %d %q %v, want 401 naming %s", c.auth, resp.StatusCode, b, resp.Header, c.want)
		}
	}
	req, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Add("Authorization", "Bearer sk-a")
	req.Header.Add("Authorization", "Bearer sk-b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(errorMessage(b), "2 Authorization headers") {
		t.Fatalf("two Authorization headers: %d %s", resp.StatusCode, b)
	}

	// X-Weir-Key from the client is dropped: no key, no request.
	req, _ = http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set(keyHeader, keyID("sk-victim"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || g.remaining("sk-victim") != 10000 {
		t.Fatalf("a client's own X-Weir-Key: %d, victim has %d", resp.StatusCode, g.remaining("sk-victim"))
	}
}

// TestBadChatRequests: a chat request whose cost cannot be bounded is a
// 400 naming the value, and nothing is counted; other paths pass through.
func TestBadChatRequests(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	for _, c := range []struct{ body, want string }{
		{`{"model":"m","messages":[]}`, "max_tokens (or max_completion_tokens) is required"},
		{`{"model":"m","max_tokens":null,"messages":[]}`, "max_tokens (or max_completion_tokens) is required"},
		{`{"model":"m","max_tokens":-1,"messages":[]}`, "max_tokens is -1"},
		{`{"model":"m","max_tokens":1.5,"messages":[]}`, "max_tokens is 1.5"},
		{`{"model":"m","max_tokens":"100","messages":[]}`, `max_tokens is "100"`},
		{`{"model":"m","max_completion_tokens":true,"messages":[]}`, "max_completion_tokens is true"},
		{`{"model":"m","max_tokens":10,"n":0,"messages":[]}`, "n is 0"},
		{`{"model":"m","max_tokens":10,"n":129,"messages":[]}`, "n is 129"},
		{`{"model":"m","max_tokens":10,"n":"2","messages":[]}`, `n is "2"`},
		{`{"model":"m","max_tokens":4000,"n":3,"messages":[]}`, "is 12000 tokens"},
		{`not json`, "not a JSON object"},
		{`null`, "not a JSON object"},
		{`[1]`, "not a JSON object"},
	} {
		resp := g.chat(context.Background(), "sk-bad", c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(errorMessage(b), c.want) {
			t.Errorf("%s: %d %s, want 400 naming %s", c.body, resp.StatusCode, b, c.want)
		}
	}
	if got := g.remaining("sk-bad"); got != 10000 {
		t.Fatalf("refused requests counted: %d remain", got)
	}
	req, _ := http.NewRequest("POST", g.url+"/v1/embeddings", strings.NewReader(`{"XUsage":7}`))
	req.Header.Set("Authorization", "Bearer sk-bad")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("another path: %d", resp.StatusCode)
	}
}

// errorMessage returns the message of an OpenAI-style error body.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error.Message
}

// TestUsageScanner: the scanner finds a top-level usage however the JSON
// is cut into pieces, and ignores "usage" in strings and nested objects.
func TestUsageScanner(t *testing.T) {
	for _, c := range []struct {
		in    string
		found bool
		total int64
	}{
		{`{"id":"x","usage":{"total_tokens":42}}`, true, 42},
		{`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`, true, 7},
		{`{"usage":null}`, false, 0},
		{`{"content":"\"usage\":{\"total_tokens\":9}","usage" : {"total_tokens":5} }`, true, 5},
		{`{"choices":[{"usage":{"total_tokens":9}}]}`, false, 0},
		{`{"x":{"usage":{"total_tokens":9}},"usage":{"total_tokens":1,"d":[1,{"a":"}"}]},"z":2}`, true, 1},
		{`{"usage":{"total_tokens":-3}}`, false, 0},
		{`{"usage":{"total_tokens":8}`, false, 0}, // cut before the usage ends
		{`{"usage":{"total_tokens":8},`, true, 8},
		{`{"usage":null}{"usage":{"total_tokens":6}}`, true, 6},
	} {
		for _, step := range []int{1, 2, 7, len(c.in)} {
			var s usageScanner
			for i := 0; i < len(c.in); i += step {
				s.write([]byte(c.in[i:min(i+step, len(c.in))]))
			}
			if s.found != c.found || s.total != c.total {
				t.Errorf("%s in pieces of %d: found %t %d, want %t %d", c.in, step, s.found, s.total, c.found, c.total)
			}
		}
	}
	// A usage over maxUsage bytes is not kept.
	var s usageScanner
	s.write([]byte(`{"usage":{"total_tokens":3,"pad":"` + strings.Repeat("x", maxUsage) + `"}}`))
	if s.found || cap(s.value) > 2*maxUsage {
		t.Fatalf("an over-long usage: found %t, kept %d bytes", s.found, cap(s.value))
	}
}

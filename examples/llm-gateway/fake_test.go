package main

import (
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

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// knobs is what a test asks the fake upstream to answer, in the request
// body's "x" field: the usage it reports, and how.
type knobs struct {
	In        int64 `json:"in"`        // uncached input tokens
	Cached    int64 `json:"cached"`    // cached input tokens (Anthropic: cache reads)
	CacheW    int64 `json:"cw"`        // Anthropic's cache writes
	Out       int64 `json:"out"`       // output tokens, reasoning excluded
	Reasoning int64 `json:"reasoning"` // OpenAI's reasoning tokens
	Pad       int   `json:"pad"`       // bytes of content before the usage
	NoUsage   bool  `json:"no_usage"`  // answer without a usage
	Cut       bool  `json:"cut"`       // Anthropic: end the stream before message_delta
	Status    int   `json:"status"`    // answer this error status
	Wait      bool  `json:"wait"`      // a stream waits on release before its usage
}

// fakeUpstream speaks OpenAI's chat completions and Anthropic's messages,
// in JSON and in server-sent events, flushing each event.
type fakeUpstream struct {
	*httptest.Server
	sawIncludeUsage atomic.Bool
	sawWeirHeader   atomic.Bool
	release         chan struct{} // a stream with wait blocks on it
	canceled        chan struct{} // closed when the gateway cancels a waiting stream
	cancelOnce      sync.Once
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	f := &fakeUpstream{canceled: make(chan struct{}), release: make(chan struct{})}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-weir-") {
			f.sawWeirHeader.Store(true)
		}
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream        bool  `json:"stream"`
		X             knobs `json:"x"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	x := req.X
	if x.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(x.Status)
		fmt.Fprint(w, `{"error":{"message":"refused","type":"invalid_request_error"}}`)
		return
	}
	pad := strings.Repeat("x", x.Pad)
	flush := func() { w.(http.Flusher).Flush() }
	wait := func() bool {
		if !x.Wait {
			return true
		}
		select {
		case <-f.release:
			return true
		case <-r.Context().Done():
			f.cancelOnce.Do(func() { close(f.canceled) })
			return false
		}
	}
	anthropicUsage := fmt.Sprintf(`{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}`, x.In, x.CacheW, x.Cached, x.Out)
	openaiUsage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d},"completion_tokens_details":{"reasoning_tokens":%d}}`,
		x.In+x.Cached, x.Out+x.Reasoning, x.In+x.Cached+x.Out+x.Reasoning, x.Cached, x.Reasoning)
	switch {
	case r.URL.Path == messagesPath && !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		usage := ""
		if !x.NoUsage {
			usage = `,"usage":` + anthropicUsage
		}
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"usage %s"}],"model":"m"%s}`, pad, usage)
	case r.URL.Path == messagesPath:
		w.Header().Set("Content-Type", "text/event-stream")
		// message_start carries the input counts and a placeholder output count.
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":%d,\"cache_creation_input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":1}}}\n\n", x.In, x.CacheW, x.Cached)
		flush()
		for i := range 3 {
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok%d \\\"usage\\\":{\\\"output_tokens\\\":1}\"}}\n\n", i)
			flush()
		}
		if !wait() || x.Cut {
			return
		}
		if x.Pad > 0 {
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"%s\"}}\n\n", pad)
		}
		if !x.NoUsage {
			fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", x.Out)
		}
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	case !req.Stream:
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			defer zw.Close()
			w = gzipWriter{w, zw}
		}
		usage := ""
		if !x.NoUsage {
			usage = `,"usage":` + openaiUsage
		}
		fmt.Fprintf(w, `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi%s"}}]%s}`, pad, usage)
	default:
		f.sawIncludeUsage.Store(req.StreamOptions.IncludeUsage)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}],\"usage\":null}\n\n", i)
			flush()
		}
		if !wait() {
			return
		}
		if req.StreamOptions.IncludeUsage && !x.NoUsage {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%s\"}}],\"usage\":null}\n\n", pad)
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\n", openaiUsage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// gzipWriter writes a response's body through a gzip.Writer.
type gzipWriter struct {
	http.ResponseWriter
	zw *gzip.Writer
}

func (g gzipWriter) Write(b []byte) (int, error) { return g.zw.Write(b) }

// Test prices, in micro-units per million tokens (USD/M × 10^6).
const (
	pIn, pCached, pOut, pReasoning = 2_000_000, 500_000, 10_000_000, 12_000_000
	cIn, cCached, cOut, cWrite     = 3_000_000, 300_000, 15_000_000, 3_750_000
)

// testPrices prices gpt-t and claude-t; a test's rules follow.
const testPrices = `
prices:
  currency: USD
  models:
    gpt-t:    {input: 2, cached_input: 0.5, output: 10, reasoning: 12}
    claude-t: {input: 3, cached_input: 0.3, output: 15, cache_write: 3.75}
  unknown: refuse
`

// testRules are budgets small enough to bind in a test: 0.1 USD per key.
const testRules = testPrices + `
rules:
  - {name: key-budget,  identity: header:X-Weir-Key,  on_missing: deny, budget: 0.1 USD/d}
  - {name: user-budget, identity: header:X-Weir-User, on_missing: skip, budget: 0.15 USD/d}
  - {name: team-budget, identity: header:X-Weir-Team, on_missing: skip, budget: 0.5 USD/d}
  - {name: org-budget,  identity: header:X-Weir-Org,  on_missing: skip, budget: 1 USD/30d}
`

// ceilDiv is a/b rounded up, for a, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// costOf is what the test expects usage x of model (gpt-t or claude-t) to
// cost, computed apart from the gateway and policy.
func costOf(model string, x knobs) int64 {
	if model == "claude-t" {
		return ceilDiv(x.In*cIn+x.CacheW*cWrite+x.Cached*cCached+x.Out*cOut, 1_000_000)
	}
	return ceilDiv(x.In*pIn+x.Cached*pCached+x.Out*pOut+x.Reasoning*pReasoning, 1_000_000)
}

// estimateOf is the estimate of a request of body bytes with max_tokens ×
// n output tokens: all input at the higher input price, all output at
// the higher output price (claude-t's highest input price is its cache
// write price).
func estimateOf(model string, bodyLen int, out int64) int64 {
	if model == "claude-t" {
		return ceilDiv(int64(bodyLen)*cWrite+out*cOut, 1_000_000)
	}
	return ceilDiv(int64(bodyLen)*pIn+out*pReasoning, 1_000_000)
}

type testGateway struct {
	t       *testing.T
	p       *policy.Policy
	clock   *storetest.Clock // nil over Redis
	url     string
	served  sync.WaitGroup // the gateway's handlers, settlement included
	hangUps atomic.Int64   // requests whose client went away while the gateway served them
	client  *http.Client
	h       *gateway
}

// newTestGateway runs the gateway under rules (nil: testRules) with the
// tenants ts in front of up, reading on for drain after a hang-up.
func newTestGateway(t *testing.T, up *fakeUpstream, rules string, ts tenants, drain time.Duration) *testGateway {
	clock := storetest.NewClock(storetest.Epoch)
	g := newTestGatewayOn(t, up, rules, ts, drain, memstore.New(memstore.WithClock(clock.Now)))
	g.clock = clock
	return g
}

// newTestGatewayOn is newTestGateway over store.
func newTestGatewayOn(t *testing.T, up *fakeUpstream, rules string, ts tenants, drain time.Duration, store weir.Store) *testGateway {
	if rules == "" {
		rules = testRules
	}
	p, err := newPolicy([]byte(rules), store)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.URL)
	h := newGateway(p, ts, u, u, drain, discardLog)
	g := &testGateway{t: t, p: p, h: h, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.served.Add(1)
		defer g.served.Done()
		stop := context.AfterFunc(r.Context(), func() { g.hangUps.Add(1) })
		h.ServeHTTP(w, r)
		stop()
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

// post sends body to path with the header hdr ("Authorization: Bearer
// KEY" when hdr is a key alone).
func (g *testGateway) post(ctx context.Context, path, key, body string, hdr ...string) *http.Response {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", g.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp
}

// do posts and reads the whole answer, then waits for the settlement.
func (g *testGateway) do(path, key, body string, hdr ...string) (int, string, http.Header) {
	g.t.Helper()
	resp := g.post(context.Background(), path, key, body, hdr...)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.served.Wait()
	return resp.StatusCode, string(b), resp.Header
}

// left returns what rule has left for identity.
func (g *testGateway) left(rule, identity string) int64 {
	g.t.Helper()
	rr, err := g.p.CheckKey(context.Background(), policy.KeyRequest{Rule: rule, Key: identity, N: 0})
	if err != nil {
		g.t.Fatal(err)
	}
	return rr.Result.Remaining
}

// keyLeft is what key-budget has left for key.
func (g *testGateway) keyLeft(key string) int64 { return g.left("key-budget", keyID(key)) }

// keyBudget is testRules' key budget, in micro-units.
const keyBudget = 100_000

// body returns a request for model with max_tokens, the knobs x and the
// fields extra (a JSON fragment, or "").
func body(model string, maxTokens int64, x knobs, extra string) string {
	xb, _ := json.Marshal(x)
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"x":%s%s,"messages":[{"role":"user","content":"hi"}]}`, model, maxTokens, xb, extra)
}

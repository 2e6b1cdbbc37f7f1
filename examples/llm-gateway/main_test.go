package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
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
	release         chan struct{} // a stream waits on it before its usage event; nil: no wait
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	f := &fakeUpstream{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(costHeader) != "" {
			f.sawCostHeader.Store(true)
		}
		var req struct {
			Stream        bool `json:"stream"`
			XUsage        int64
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`, req.XUsage-5, req.XUsage)
			return
		}
		f.sawIncludeUsage.Store(req.StreamOptions.IncludeUsage)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		if f.release != nil {
			<-f.release
		}
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", req.XUsage-5, req.XUsage)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.Close)
	return f
}

type gateway struct {
	t     *testing.T
	p     *policy.Policy
	clock *storetest.Clock
	url   string
}

func newTestGateway(t *testing.T, up *fakeUpstream) *gateway {
	clock := storetest.NewClock(storetest.Epoch)
	p, err := newPolicy(memstore.New(memstore.WithClock(clock.Now)))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(up.URL)
	srv := httptest.NewServer(newGateway(p, u))
	t.Cleanup(srv.Close)
	return &gateway{t: t, p: p, clock: clock, url: srv.URL}
}

// chat posts a completion request for key.
func (g *gateway) chat(ctx context.Context, key string, body string) *http.Response {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", g.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(costHeader, "1") // a client cannot choose its own cost
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp
}

// remaining peeks at key's tokens.
func (g *gateway) remaining(key string) int64 {
	g.t.Helper()
	rr, err := g.p.CheckKeyTier(context.Background(), "llm-tokens", "", "Bearer "+key, 0)
	if err != nil {
		g.t.Fatal(err)
	}
	return rr.Result.Remaining
}

// TestJSONUsageSettles: max_tokens is reserved, usage.total_tokens charged.
func TestJSONUsageSettles(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up)
	resp := g.chat(context.Background(), "sk-a", `{"model":"m","max_tokens":800,"XUsage":130,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"total_tokens":130`) {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	// The reservation shows in the response's headers: 10000 − 800.
	if got := resp.Header.Get("RateLimit"); !strings.Contains(got, "r=9200") {
		t.Fatalf("RateLimit header %q, want r=9200 (800 reserved)", got)
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
	resp = g.chat(context.Background(), "sk-b", `{"model":"m","max_tokens":1,"XUsage":1,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 2001 tokens at 6ms each: 12.006s, so Retry-After 13.
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "13" || !strings.Contains(resp.Header.Get("RateLimit"), `"llm-tokens";r=0`) || !strings.Contains(string(b), "llm-tokens") {
		t.Fatalf("a key in debt: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	g.clock.Advance(12006 * time.Millisecond)
	resp = g.chat(context.Background(), "sk-b", `{"model":"m","max_tokens":1,"XUsage":1,"messages":[]}`)
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
func waitRemaining(t *testing.T, g *gateway, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.remaining(key) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d tokens remain, want %d", key, g.remaining(key), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamCutKeepsReservation: a client that goes away before the usage
// event leaves the reservation charged, no more and no less.
func TestStreamCutKeepsReservation(t *testing.T) {
	up := newFakeUpstream(t)
	up.release = make(chan struct{})
	defer close(up.release)
	g := newTestGateway(t, up)
	ctx, cancel := context.WithCancel(context.Background())
	resp := g.chat(ctx, "sk-c", `{"model":"m","stream":true,"max_tokens":700,"XUsage":50,"messages":[]}`)
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	waitRemaining(t, g, "sk-c", 9300)
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

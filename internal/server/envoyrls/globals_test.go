package envoyrls

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const globalsYAML = `domain: g
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: b
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: c
    rate_limit: { unit: minute, unit_multiplier: 10, requests_per_unit: 7 }
  - key: free
    rate_limit: { unlimited: true }
  - key: sh
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
`

// TestGlobalShadowMode: every descriptor is decided and counted, statuses
// say OVER_LIMIT as decided, the overall code is always OK, and the
// observer and counter see each shadowed call, exactly, under concurrency.
func TestGlobalShadowMode(t *testing.T) {
	var limited atomic.Int64
	h := start(t, mustParse(t, globalsYAML), WithShadowMode(true), WithObserver(func(_ context.Context, d Observation) {
		if d.Outcome == Limited {
			limited.Add(1)
		}
	}))
	const workers, each = 10, 10
	var over, ok atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp := h.call(request("g", 1, desc("a", "x")))
				if resp.OverallCode != rlspb.RateLimitResponse_OK {
					t.Errorf("overall %v in shadow mode, want OK", resp.OverallCode)
				}
				switch resp.Statuses[0].Code {
				case rlspb.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				case rlspb.RateLimitResponse_OK:
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	n := int64(workers * each)
	if ok.Load() != 2 || over.Load() != n-2 {
		t.Fatalf("statuses: %d OK, %d OVER_LIMIT; want 2 and %d (the limit is 2)", ok.Load(), over.Load(), n-2)
	}
	if got := h.svc.ShadowedCalls(); got != uint64(n-2) {
		t.Errorf("ShadowedCalls = %d, want %d", got, n-2)
	}
	if limited.Load() != n-2 {
		t.Errorf("observer saw %d Limited, want %d", limited.Load(), n-2)
	}

	// Without shadow mode the same state answers OVER_LIMIT.
	h2 := start(t, mustParse(t, globalsYAML))
	h2.call(request("g", 2, desc("a", "x")))
	if resp := h2.call(request("g", 1, desc("a", "x"))); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("without shadow mode: overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	if h2.svc.ShadowedCalls() != 0 {
		t.Fatalf("ShadowedCalls = %d without shadow mode", h2.svc.ShadowedCalls())
	}
}

// TestGlobalQuotaMode: the call is OVER_LIMIT only when every descriptor
// but the unlimited ones is over, matched or not; statuses stay as decided.
func TestGlobalQuotaMode(t *testing.T) {
	for _, quota := range []bool{false, true} {
		h := start(t, mustParse(t, globalsYAML), WithQuotaMode(quota))
		h.call(request("g", 2, desc("a", "x"))) // a is used up
		codes := func(resp *rlspb.RateLimitResponse) string {
			var s []string
			for _, st := range resp.Statuses {
				s = append(s, st.Code.String())
			}
			return resp.OverallCode.String() + " " + strings.Join(s, ",")
		}
		cases := []struct {
			descs      []string // keys; "none" matches nothing
			plain, quo string
		}{
			{[]string{"a", "b"}, "OVER_LIMIT OVER_LIMIT,OK", "OK OVER_LIMIT,OK"},
			{[]string{"a", "none"}, "OVER_LIMIT OVER_LIMIT,OK", "OK OVER_LIMIT,OK"},
			{[]string{"a", "free"}, "OVER_LIMIT OVER_LIMIT,OK", "OVER_LIMIT OVER_LIMIT,OK"},
			{[]string{"a"}, "OVER_LIMIT OVER_LIMIT", "OVER_LIMIT OVER_LIMIT"},
			{[]string{"free"}, "OK OK", "OK OK"},
		}
		for _, c := range cases {
			req := request("g", 1)
			for _, k := range c.descs {
				req.Descriptors = append(req.Descriptors, desc(k, "x"))
			}
			want := c.plain
			if quota {
				want = c.quo
			}
			if got := codes(h.call(req)); got != want {
				t.Errorf("quota mode %v, descriptors %v: got %s, want %s", quota, c.descs, got, want)
			}
		}
	}
}

// TestResponseHeaders: upstream's three headers, from the descriptor with
// the least remaining, or the last one over its limit; the reset counts
// to the end of the unit, whatever the multiplier.
func TestResponseHeaders(t *testing.T) {
	h := start(t, mustParse(t, globalsYAML), WithResponseHeaders(true))
	hdrs := func(resp *rlspb.RateLimitResponse) string {
		var s []string
		for _, hv := range resp.ResponseHeadersToAdd {
			s = append(s, hv.Key+"="+hv.Value)
		}
		return strings.Join(s, " ")
	}
	// base is 17.25 s into a minute and an hour.
	steps := []struct {
		descs []string
		want  string
	}{
		// a: 2/min, 1 left after this call; b: 5/h, 4 left.
		{[]string{"b", "a"}, "RateLimit-Limit=2 RateLimit-Remaining=1 RateLimit-Reset=43"},
		// c: 7 per 10 minutes: the reset is still the minute's.
		{[]string{"c"}, "RateLimit-Limit=7 RateLimit-Remaining=6 RateLimit-Reset=43"},
		// equal remaining: the first wins (a: 0 left, sh: 0 left).
		{[]string{"a", "sh"}, "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=43"},
		// a over (plain), then sh over in shadow (status OK): a wins.
		{[]string{"a", "sh", "b"}, "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=43"},
		// two over their limits: the last one.
		{[]string{"a", "sh", "b", "a"}, "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=43"},
		// only unlimited and unmatched: no headers.
		{[]string{"free", "none"}, ""},
	}
	for _, s := range steps {
		req := request("g", 1)
		for _, k := range s.descs {
			req.Descriptors = append(req.Descriptors, desc(k, "x"))
		}
		if got := hdrs(h.call(req)); got != s.want {
			t.Errorf("descriptors %v: headers %q, want %q", s.descs, got, s.want)
		}
	}
	// The last over-limit descriptor wins over an earlier one.
	h3 := start(t, mustParse(t, globalsYAML), WithResponseHeaders(true))
	h3.call(request("g", 2, desc("a", "y")))
	h3.call(request("g", 7, desc("c", "y")))
	if got := hdrs(h3.call(request("g", 1, desc("c", "y"), desc("a", "y")))); got != "RateLimit-Limit=2 RateLimit-Remaining=0 RateLimit-Reset=43" {
		t.Errorf("two over: %q, want a's", got)
	}
	if got := hdrs(h3.call(request("g", 1, desc("a", "y"), desc("c", "y")))); got != "RateLimit-Limit=7 RateLimit-Remaining=0 RateLimit-Reset=43" {
		t.Errorf("two over: %q, want c's", got)
	}
	// Off by default.
	h2 := start(t, mustParse(t, globalsYAML))
	if got := hdrs(h2.call(request("g", 1, desc("a", "x")))); got != "" {
		t.Errorf("headers without the option: %q", got)
	}
}

// TestUnknownDomainCalls counts calls to a domain the config lacks.
func TestUnknownDomainCalls(t *testing.T) {
	h := start(t, mustParse(t, globalsYAML))
	h.call(request("g", 1, desc("a", "x")))
	for range 3 {
		h.call(request("nope", 1, desc("a", "x")))
	}
	if got := h.svc.UnknownDomainCalls(); got != 3 {
		t.Fatalf("UnknownDomainCalls = %d, want 3", got)
	}
}

// TestMergeDomains: without the option a domain in two files is refused;
// with it the files' descriptors join, and a descriptor in both is still
// refused, naming the file.
func TestMergeDomains(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1.yaml", "domain: m\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n")
	write("2.yaml", "domain: m\ndescriptors:\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n")
	if _, err := LoadDirWith(dir, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `domain "m" is already defined`) {
		t.Fatalf("without merging: err = %v, want the duplicate domain refused", err)
	}
	cfg, err := LoadDirWith(dir, LoadOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, cfg)
	resp := h.call(request("m", 1, desc("a", "x"), desc("b", "x")))
	if rpu := []uint32{resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), resp.Statuses[1].GetCurrentLimit().GetRequestsPerUnit()}; rpu[0] != 1 || rpu[1] != 2 {
		t.Fatalf("merged limits %v, want [1 2]", rpu)
	}
	write("3.yaml", "domain: m\ndescriptors:\n  - key: a\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n")
	_, err = LoadDirWith(dir, LoadOptions{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), `3.yaml:3: duplicate descriptor: key "a" is already defined by an earlier file of domain "m"`) {
		t.Fatalf("duplicate across merged files: err = %v, want 3.yaml:3 duplicate descriptor", err)
	}
	// A wildcard and an exact value too.
	write("3.yaml", "domain: m\ndescriptors:\n  - key: w\n    value: p*\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n")
	write("4.yaml", "domain: m\ndescriptors:\n  - key: w\n    value: p*\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n")
	if _, err = LoadDirWith(dir, LoadOptions{MergeDomains: true}); err == nil || !strings.Contains(err.Error(), `4.yaml:3: duplicate descriptor: key "w" with value "p*"`) {
		t.Fatalf("duplicate wildcard across merged files: err = %v", err)
	}
}

// TestLoadDirDigest: the digest changes with a file's content, a file
// added or one renamed, and not otherwise.
func TestLoadDirDigest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	digest := func() [32]byte {
		t.Helper()
		_, sum, err := LoadDirDigest(dir, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	write("a.yaml", "domain: a\n")
	d1 := digest()
	if digest() != d1 {
		t.Fatal("the digest of an unchanged directory changed")
	}
	write("a.yaml", "domain: a2\n")
	d2 := digest()
	write("b.yaml", "domain: b\n")
	d3 := digest()
	if err := os.Rename(filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	d4 := digest()
	if d1 == d2 || d2 == d3 || d3 == d4 {
		t.Fatalf("digests %x %x %x %x: a change went unseen", d1[:4], d2[:4], d3[:4], d4[:4])
	}
}

package envoyrls

import (
	"context"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// debitYAML: LLM tokens per API key, 1000 a minute, counted on the
// response path (debit: true), beside an ordinary request limit.
const debitYAML = `
domain: llm
descriptors:
  - key: api_key
    debit: true
    rate_limit: { unit: minute, requests_per_unit: 1000, algorithm: token_bucket }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 5 }
`

// TestDebitDescriptor: a request-path check (hits_addend 0) peeks; the
// response-path call counts all its hits even past the limit, so the key
// is then over the limit until the debt is paid back.
func TestDebitDescriptor(t *testing.T) {
	h := start(t, mustParse(t, debitYAML))
	key := func() *rlcommon.RateLimitDescriptor { return desc("api_key", "sk-1") }
	check := func(hits uint64, d *rlcommon.RateLimitDescriptor) *rlspb.RateLimitResponse {
		t.Helper()
		r, err := h.client.ShouldRateLimit(context.Background(), request("llm", 0, withHits(d, hits)))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := check(0, key()); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("request-path check on a fresh key: %v", r)
	}
	// The stream used 1600 tokens: all are counted, 600 of them as debt.
	if r := check(1600, key()); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("response-path debit of 1600: %v", r)
	}
	if r := check(0, key()); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a key in debt passed the request-path check: %v", r)
	}
	// 601 tokens refill in 36.06s: one µs earlier the key is still over.
	h.clk.Add(36060*time.Millisecond - time.Microsecond)
	if r := check(0, key()); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("check before the debt is paid: %v", r)
	}
	h.clk.Add(time.Microsecond)
	if r := check(0, key()); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("check once the debt is paid: %v", r)
	}
	// is_negative_hits on a debit descriptor gives hits back.
	neg := withHits(key(), 1)
	neg.IsNegativeHits = true
	if r, err := h.client.ShouldRateLimit(context.Background(), request("llm", 0, neg)); err != nil || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("a negative hit on a debit descriptor: %v %v", r, err)
	}
	check(1, key())
	// A debit descriptor in one call with an ordinary one: each counts.
	r, err := h.client.ShouldRateLimit(context.Background(), request("llm", 0, withHits(key(), 1), desc("path", "/v1/chat")))
	if err != nil || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].LimitRemaining != 4 {
		t.Fatalf("mixed call: %v %v", r, err)
	}
}

func TestDebitConfigErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: k\n    debit: true\n", "test.yaml:4: debit needs a rate_limit"},
		{"domain: d\ndescriptors:\n  - key: k\n    debit: true\n    rate_limit: { unit: minute, requests_per_unit: 0 }\n", "test.yaml:4: debit needs a limit to count against"},
		{"domain: d\ndescriptors:\n  - key: k\n    debit: maybe\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n", "debit"},
	} {
		_, err := Parse([]byte(c.yaml), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

package protect

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

// TestRejectionShape: a protect rule's 503 carries the members of the one
// rejection shape: protect names the rule, rule (a rate limit's) is left
// out, blocked_until is 0; a browser still gets JSON from WriteRejection.
func TestRejectionShape(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteRejection(rec, &Rejection{Rule: "api", Reason: ReasonOverloaded, RetryAfter: 1500 * time.Millisecond})
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"blocked_until", "detail", "error", "protect", "retry_after_ms", "status", "title", "type"}
	if !slices.Equal(keys, want) {
		t.Fatalf("members %v, want %v", keys, want)
	}
	if body["protect"] != "api" || body["retry_after_ms"] != float64(1500) || rec.Header().Get("Retry-After") != "2" {
		t.Fatalf("body %s, Retry-After %q", rec.Body, rec.Header().Get("Retry-After"))
	}
	if rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("Content-Type") != ProblemContentType {
		t.Fatalf("headers %v", rec.Header())
	}
}

func TestPrefersHTML(t *testing.T) {
	for accept, want := range map[string]bool{
		"text/html":                               true,
		"text/html, application/json":             false,
		"application/json;q=0.5, text/html":       true,
		"*/*":                                     false,
		"application/xhtml+xml,*/*;q=0.8":         true,
		"text/html;q=0.1, */*;q=0.2":              false,
		"garbage;;;, text/html":                   true,
		"application/problem+json, text/html;q=1": false,
	} {
		if got := prefersHTML([]string{accept}); got != want {
			t.Errorf("prefersHTML(%q) = %v, want %v", accept, got, want)
		}
	}
}

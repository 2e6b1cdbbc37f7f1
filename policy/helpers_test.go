package policy

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/storefake"
	"github.com/weir-dev/weir/storetest"
)

// newClock returns a stepped clock at storetest.Epoch.
func newClock() *storetest.Clock { return storetest.NewClock(storetest.Epoch) }

// fakeStore wraps a memstore, counts calls, and fails on demand.
type fakeStore = storefake.Store

func newFakeStore(clock *storetest.Clock) *fakeStore {
	if clock == nil {
		return storefake.New(nil)
	}
	return storefake.New(clock.Now)
}

var errDown = storefake.ErrDown

// countingHandler counts slog records whose message is msg.
type countingHandler = storefake.LogCounter

// singleStore is a wrapper that offers only weir.Store.
type singleStore struct{ weir.Store }

// mustPolicy parses doc and builds a Policy over store.
func mustPolicy(t testing.TB, doc string, store weir.Store, opts ...Option) *Policy {
	t.Helper()
	cfg, err := Parse([]byte(doc), t.Name()+".yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// req builds a request from 192.0.2.1 with header pairs.
func req(method, target string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = "192.0.2.1:4321"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func from(r *http.Request, addr string) *http.Request {
	r.RemoteAddr = addr
	return r
}

// names lists the rules in a verdict's results.
func names(v Verdict) []string {
	var out []string
	for _, r := range v.Results {
		out = append(out, r.Rule)
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

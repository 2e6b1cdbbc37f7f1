package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestWithCostAndCharge: the estimate a request names is taken before the
// handler, and what the streaming handler charged is settled after it,
// into debt when it passes what remained.
func TestWithCostAndCharge(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(clock.Now)))
	l := weir.PerMinute(weir.TokenBucket, 100)
	cost := func(r *http.Request) (int64, error) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 || n > 100 {
			return 0, fmt.Errorf("%w: n=%q", httplimit.ErrBadCost, r.URL.Query().Get("n"))
		}
		return n, nil
	}
	var used int64
	mw := httplimit.New(lim, l, httplimit.WithCost(cost), httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil }))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := int64(1); i <= used; i++ { // a stream, charged as it goes
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
			httplimit.Charge(r, i)
		}
	}))
	get := func(q string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/?"+q, nil))
		return w
	}
	peek := func() weir.Result {
		res, err := lim.Peek(context.Background(), weir.Key(httplimit.DefaultName, "k"), l)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	used = 7
	if w := get("n=40"); w.Code != 200 || !strings.Contains(w.Header().Get("RateLimit"), "r=60") || !w.Flushed {
		t.Fatalf("estimate 40: %d %v", w.Code, w.Header())
	}
	if got := peek().Remaining; got != 93 {
		t.Fatalf("40 reserved, 7 charged: %d remaining, want 93", got)
	}
	used = 150
	get("n=10")
	res := peek()
	// 93 − 150 = −57: 58 tokens to refill at 0.6 s each.
	if res.Allowed || res.RetryAfter != 58*600*time.Millisecond {
		t.Fatalf("after a 150 stream: %+v", res)
	}
	if w := get("n=1"); w.Code != 429 {
		t.Fatalf("in debt: %d", w.Code)
	}
	if w := get("n=abc"); w.Code != 400 || !strings.Contains(w.Body.String(), `n=\"abc\"`) {
		t.Fatalf("a bad cost: %d %s", w.Code, w.Body)
	}
	// Charge outside a cost rule does nothing.
	if httplimit.Charge(httptest.NewRequest("GET", "/", nil), 5) {
		t.Fatal("Charge without a meter reported true")
	}
}

// TestChargeSettlesLate: a request that ran past its take's window settles
// with the take's time: a fixed window of 10 a minute, 10
// reserved at 0:59, others take 10 at 1:01 while the handler runs, and the
// handler charges 0: nothing comes back, the window stays at 10.
func TestChargeSettlesLate(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch.Add(59 * time.Second))
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(clock.Now)))
	l := weir.PerMinute(weir.FixedWindow, 10)
	key := weir.Key(httplimit.DefaultName, "k")
	mw := httplimit.New(lim, l, httplimit.WithCost(func(*http.Request) (int64, error) { return 10, nil }),
		httplimit.WithKey(func(*http.Request) (string, error) { return "k", nil }))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clock.Set(storetest.Epoch.Add(61 * time.Second))
		if res, err := lim.AllowN(r.Context(), key, l, 10); err != nil || !res.Allowed {
			t.Errorf("others in the next window: %+v %v", res, err)
		}
		httplimit.Charge(r, 0)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 200 {
		t.Fatalf("the request: %d", w.Code)
	}
	if res, err := lim.Peek(context.Background(), key, l); err != nil || res.Allowed {
		t.Fatalf("a late settle gave back the take's 10 in the next window: %+v %v", res, err)
	}
}

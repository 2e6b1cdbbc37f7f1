package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

// 1000 LLM tokens a minute per client: each request reserves the
// max_tokens it names, and the handler charges what it really used.
func ExampleCharge() {
	now := func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(now)))
	tokens := weir.PerMinute(weir.TokenBucket, 1000)
	maxTokens := func(r *http.Request) (int64, error) {
		n, err := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
		if err != nil || n < 0 || n > 1000 {
			return 0, fmt.Errorf("%w: X-Max-Tokens must be 0 to 1000", httplimit.ErrBadCost)
		}
		return n, nil
	}
	mw := httplimit.New(lim, tokens, httplimit.WithName("llm"), httplimit.WithCost(maxTokens))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ... stream the completion, then charge its usage:
		httplimit.Charge(r, 120)
	}))

	for i := 1; i <= 2; i++ {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		r.Header.Set("X-Max-Tokens", "500")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "llm";r=500;t=30
	// 200 "llm";r=380;t=38
}

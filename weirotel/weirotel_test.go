package weirotel_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/weirotel"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// checkAndStore finds the check span and its store child, and asserts
// their parent links: the check under the caller's traceparent, the store
// call under the check.
func checkAndStore(t *testing.T, rec *tracetest.SpanRecorder) (check, store sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "weir.check":
			check = s
		case "weir.store.take", "weir.store.take_all":
			store = s
		}
	}
	if check == nil || store == nil {
		t.Fatalf("spans: %d ended, check %v store %v", len(rec.Ended()), check != nil, store != nil)
	}
	if check.Parent().SpanID().String() != "00f067aa0ba902b7" || check.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("check span's parent %v in trace %v: not the caller's", check.Parent().SpanID(), check.SpanContext().TraceID())
	}
	if store.Parent().SpanID() != check.SpanContext().SpanID() {
		t.Errorf("store span's parent %v, want the check %v", store.Parent().SpanID(), check.SpanContext().SpanID())
	}
	return check, store
}

// TestMiddlewareTracer: httplimit.New with WithTracer makes a check span
// from the request's traceparent, with the rule and the answer, and the
// traced store's call is its child; a rejection says allowed=false.
func TestMiddlewareTracer(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := weirotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil)
	lim := weir.NewLimiter(tr.Store(memstore.New()))
	mw := httplimit.New(lim, weir.PerMinute(weir.SlidingLog, 1), httplimit.WithName("login"), httplimit.WithTracer(tr.Middleware()))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, want := range []bool{true, false} {
		rec2 := rec.Ended()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("traceparent", parent)
		h.ServeHTTP(httptest.NewRecorder(), r)
		if len(rec.Ended()) != len(rec2)+2 {
			t.Fatalf("request %d: %d spans ended, want 2", i, len(rec.Ended())-len(rec2))
		}
		check := rec.Ended()[len(rec.Ended())-1]
		a := attrs(check)
		if check.Name() != "weir.check" || a["weir.rule"].AsString() != "login" || a["weir.allowed"].AsBool() != want {
			t.Errorf("request %d: %s %v", i, check.Name(), a)
		}
	}
	checkAndStore(t, rec)
}

// TestPolicyMiddlewareTracer: policy.Middleware reports tiers, and the
// rejecting rule names the span when several apply.
func TestPolicyMiddlewareTracer(t *testing.T) {
	cfg, err := policy.Parse([]byte(`rules:
  - name: all
    limit: 100/m
  - name: plans
    identity: [header:X-Key]
    tiers:
      by: header:X-Plan
      default: { limit: 1/m }
      pro: { limit: 5/m }
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tr := weirotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil)
	p, err := policy.New(cfg, tr.Store(memstore.New()))
	if err != nil {
		t.Fatal(err)
	}
	h := policy.Middleware(p, httplimit.WithTracer(tr.Middleware()))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i := 0; i < 2; i++ {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("traceparent", parent)
		r.Header.Set("X-Key", "k")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	ended := rec.Ended()
	last := ended[len(ended)-1]
	a := attrs(last)
	if last.Name() != "weir.check" || a["weir.rule"].AsString() != "plans" || a["weir.tier"].AsString() != "default" ||
		a["weir.allowed"].AsBool() || a["weir.rules"].AsInt64() != 2 {
		t.Errorf("second request's check: %v", a)
	}
	checkAndStore(t, rec)
}

// TestNilTracing: a nil *Tracing (tracing off) hands the store back
// unwrapped.
func TestNilTracing(t *testing.T) {
	var nilT *weirotel.Tracing
	s := memstore.New()
	if nilT.Store(s) != weir.Store(s) {
		t.Error("a nil Tracing wrapped the store")
	}
}

// Trace a middleware's decisions and their store calls. In a service, the
// provider is the one the program configured (otel.GetTracerProvider).
func ExampleTracing_Middleware() {
	rec := tracetest.NewSpanRecorder()
	tr := weirotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil)
	lim := weir.NewLimiter(tr.Store(memstore.New()))
	mw := httplimit.New(lim, weir.PerMinute(weir.SlidingLog, 10), httplimit.WithName("api"), httplimit.WithTracer(tr.Middleware()))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), r)
	for _, s := range rec.Ended() {
		fmt.Println(s.Name(), s.SpanContext().TraceID())
	}
	// Output:
	// weir.store.take 4bf92f3577b34da6a3ce929d0e0e4736
	// weir.check 4bf92f3577b34da6a3ce929d0e0e4736
}

// TestUnsampled: a request the sampler drops records no span, neither the
// check nor its store call, and is still decided.
func TestUnsampled(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := weirotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.NeverSample())), nil)
	lim := weir.NewLimiter(tr.Store(memstore.New()))
	h := httplimit.New(lim, weir.PerMinute(weir.SlidingLog, 1), httplimit.WithTracer(tr.Middleware()))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	codes := []int{}
	for range 2 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		codes = append(codes, w.Code)
	}
	if len(rec.Started()) != 0 || codes[0] != 200 || codes[1] != 429 {
		t.Fatalf("spans %d, codes %v", len(rec.Started()), codes)
	}
}

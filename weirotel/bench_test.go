package weirotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/weirotel"
)

// discard is a span exporter that drops everything.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkMiddleware measures what tracing adds to a decision through
// httplimit.New on the memory store: off, and on with every request
// sampled and batched to an exporter that drops the spans, and on with
// none sampled.
//
//	go test -run '^$' -bench BenchmarkMiddleware -benchmem ./weirotel/
func BenchmarkMiddleware(b *testing.B) {
	for _, mode := range []string{"off", "sampled", "unsampled"} {
		traced := mode != "off"
		b.Run(mode, func(b *testing.B) {
			var tr *weirotel.Tracing
			if traced {
				sampler := sdktrace.AlwaysSample()
				if mode == "unsampled" {
					sampler = sdktrace.NeverSample()
				}
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sampler))
				defer tp.Shutdown(context.Background())
				tr = weirotel.New(tp, nil)
			}
			lim := weir.NewLimiter(tr.Store(memstore.New()))
			opts := []httplimit.Option{httplimit.WithName("api")}
			if traced {
				opts = append(opts, httplimit.WithTracer(tr.Middleware()))
			}
			h := httplimit.New(lim, weir.PerSecond(weir.TokenBucket, 1000000), opts...)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("traceparent", parent)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}

package weirotel_test

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
	"github.com/weir-dev/weir/weirotel"
)

// TestStoreConformance: the traced store is still a correct store (and a
// MultiStore): it passes the conformance suite every store passes, while
// recording a span per call.
func TestStoreConformance(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tr := weirotel.New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s := memstore.New(memstore.WithClock(clock.Now))
		wrapped := tr.Store(s)
		if wrapped == nil {
			t.Fatal("the traced memstore lost weir.Store")
		}
		return storetest.Harness{Store: wrapped, Clock: clock, TTL: s.TTL}
	})
	if len(rec.Ended()) == 0 {
		t.Fatal("no store spans recorded")
	}
}

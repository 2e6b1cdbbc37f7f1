package otelsetup

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
)

// TestOTelErrorsThroughSlogRateLimited: OpenTelemetry's errors go to the
// slog logger (otel.Handle reaches it), and ten minutes of an export
// failing every 5 s are 10 records, not 120, whose counts add up to every
// error.
func TestOTelErrorsThroughSlogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	LogErrors(log)
	t.Cleanup(func() { otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {})) })
	otel.Handle(errors.New("traces export: connection refused"))
	if !strings.Contains(buf.String(), `"msg":"weir: OpenTelemetry error"`) || !strings.Contains(buf.String(), "connection refused") {
		t.Fatalf("otel.Handle did not reach slog: %q", buf.String())
	}

	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var recs []map[string]any
	h := slog.New(recordFunc(func(r slog.Record) {
		m := map[string]any{"msg": r.Message}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Any(); return true })
		recs = append(recs, m)
	}))
	e := newErrorLog(h, func() time.Time { return clock }, time.Minute)
	const n = 120 // ten minutes, one every 5 s
	for range n {
		e.Handle(errors.New("traces export: context deadline exceeded"))
		clock = clock.Add(5 * time.Second)
	}
	if len(recs) != 10 {
		t.Fatalf("%d records for %d errors in ten minutes, want 10", len(recs), n)
	}
	total := 0
	for _, r := range recs {
		total += 1 + int(r["errors_not_logged"].(int64))
	}
	// The errors after the last record are counted in the next one.
	if total+11 != n {
		t.Fatalf("the records account for %d errors, want %d", total, n-11)
	}
}

type recordFunc func(slog.Record)

func (f recordFunc) Enabled(context.Context, slog.Level) bool { return true }
func (f recordFunc) Handle(_ context.Context, r slog.Record) error {
	f(r)
	return nil
}
func (f recordFunc) WithAttrs([]slog.Attr) slog.Handler { return f }
func (f recordFunc) WithGroup(string) slog.Handler      { return f }

// Package otelsetup configures OpenTelemetry's SDK for weir serve from the
// standard OTEL_* environment variables: an OTLP trace exporter, the batch
// span processor, the sampler and the resource. It is the binary's part of
// tracing. Package weirotel, the library's part, depends on the
// OpenTelemetry API only, so that a program that uses its store wrapper or
// check instrumentation links neither the SDK nor an exporter; such a
// program configures the SDK itself and hands weirotel.New its provider.
package otelsetup

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/weir-dev/weir/weirotel"
)

// Enabled reports whether the standard OTEL_* environment variables ask
// for traces: an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp, and
// not OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none.
func Enabled(lookup func(string) (string, bool)) bool {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false
	case "":
	default:
		return true
	}
	return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv builds tracing from the standard OTEL_* environment variables,
// or returns a nil *weirotel.Tracing when they do not ask for it
// (Enabled). The exporter is OTLP over HTTP/protobuf, or gRPC with
// OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL) grpc; the exporter,
// the sampler (OTEL_TRACES_SAMPLER), the batch processor (OTEL_BSP_*) and
// the resource (OTEL_SERVICE_NAME, default "weir", and
// OTEL_RESOURCE_ATTRIBUTES) read their own variables from the process
// environment. shutdown flushes the spans not yet exported and stops the
// provider; call it at exit. It is never nil, and does nothing when
// tracing is off.
func FromEnv(ctx context.Context, lookup func(string) (string, bool)) (t *weirotel.Tracing, shutdown func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	if !Enabled(lookup) {
		return nil, none, nil
	}
	get := func(k string) string { v, _ := lookup(k); return strings.ToLower(strings.TrimSpace(v)) }
	if exp := get("OTEL_TRACES_EXPORTER"); exp != "" && exp != "otlp" {
		return nil, none, fmt.Errorf("weirotel: OTEL_TRACES_EXPORTER=%q: weir exports traces by otlp only (or none)", exp)
	}
	proto := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	switch proto {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, none, fmt.Errorf("weirotel: OTLP protocol %q: want http/protobuf or grpc", proto)
	}
	if err != nil {
		return nil, none, fmt.Errorf("weirotel: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "weir")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, none, fmt.Errorf("weirotel: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return weirotel.New(tp, nil), tp.Shutdown, nil
}

// errorEvery is the least time between two log records of OpenTelemetry's
// errors: an unreachable collector fails an export every few seconds.
const errorEvery = time.Minute

// LogErrors sends the errors OpenTelemetry reports (an export that failed,
// a bad attribute), which it would otherwise print through the standard
// log package, to log at WARN: the first at once, then at most one record
// a minute, which counts the errors it stands for.
func LogErrors(log *slog.Logger) {
	otel.SetErrorHandler(newErrorLog(log, time.Now, errorEvery))
}

// errorLog is an otel.ErrorHandler that logs through slog, rate-limited.
type errorLog struct {
	log   *slog.Logger
	now   func() time.Time
	every time.Duration

	mu     sync.Mutex
	last   time.Time // when the last record was written
	unseen int       // errors since then, not logged
}

func newErrorLog(log *slog.Logger, now func() time.Time, every time.Duration) *errorLog {
	return &errorLog{log: log, now: now, every: every}
}

// Handle implements otel.ErrorHandler.
func (e *errorLog) Handle(err error) {
	now := e.now()
	e.mu.Lock()
	if !e.last.IsZero() && now.Sub(e.last) < e.every {
		e.unseen++
		e.mu.Unlock()
		return
	}
	n := e.unseen
	e.last, e.unseen = now, 0
	e.mu.Unlock()
	e.log.Warn("weir: OpenTelemetry error", "err", err, "errors_not_logged", n)
}

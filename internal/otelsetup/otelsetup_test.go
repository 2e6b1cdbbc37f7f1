package otelsetup_test

import (
	"context"
	"testing"

	"github.com/weir-dev/weir/internal/otelsetup"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// TestEnabled: tracing is off unless OTEL_* asks for it.
func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, false},
	} {
		if got := otelsetup.Enabled(lookupIn(tc.env)); got != tc.want {
			t.Errorf("Enabled(%v) = %v", tc.env, got)
		}
	}
	if _, _, err := otelsetup.FromEnv(context.Background(), lookupIn(map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"})); err == nil {
		t.Error("OTEL_TRACES_EXPORTER=zipkin accepted")
	}
	if _, _, err := otelsetup.FromEnv(context.Background(), lookupIn(map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})); err == nil {
		t.Error("OTEL_EXPORTER_OTLP_PROTOCOL=http/json accepted")
	}
}

// TestFromEnvOff: with tracing off FromEnv returns no Tracing and a
// shutdown that does nothing; with it on, a Tracing and a shutdown that
// stops the provider. Where spans arrive is tested in package server and
// in weir serve's tests, against an OTLP receiver.
func TestFromEnvOff(t *testing.T) {
	ctx := context.Background()
	tr, shutdown, err := otelsetup.FromEnv(ctx, lookupIn(nil))
	if tr != nil || shutdown == nil || err != nil {
		t.Fatalf("off: %v, shutdown %v, %v", tr, shutdown != nil, err)
	}
	if err := shutdown(ctx); err != nil {
		t.Fatalf("off: shutdown: %v", err)
	}
	tr, shutdown, err = otelsetup.FromEnv(ctx, lookupIn(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}))
	if tr == nil || shutdown == nil || err != nil {
		t.Fatalf("on: %v, shutdown %v, %v", tr, shutdown != nil, err)
	}
	if err := shutdown(ctx); err != nil {
		t.Fatalf("on: shutdown with nothing to export: %v", err)
	}
}

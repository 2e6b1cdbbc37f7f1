package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// jsonLines parses every line of out as a JSON object, failing the test on
// a line that is not one.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("--log-format json printed a line that is not JSON: %q", line)
		}
		recs = append(recs, m)
	}
	return recs
}

// TestServeLogFormatJSONEverywhere: under --log-format json the start-up
// banner is a JSON record, nothing goes to stdout, and its attributes hold
// values, not their own names (grpc is the address, not "gRPC :8081").
func TestServeLogFormatJSONEverywhere(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	env := map[string]string{"WEIR_SHUTDOWN_DELAY": "0"}
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--log-format", "json", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--resp", "127.0.0.1:0"},
			stdout, stderr, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	}()
	var started map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for started == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no start-up record after 20s: stderr %q", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
		if !strings.Contains(stderr.String(), "weir serve started") {
			continue
		}
		for _, r := range jsonLines(t, stderr.String()) {
			if r["msg"] == "weir serve started" {
				started = r
			}
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if stdout.String() != "" {
		t.Errorf("--log-format json wrote plain text to stdout: %q", stdout.String())
	}
	recs := jsonLines(t, stderr.String())
	resp := false
	for _, r := range recs {
		resp = resp || r["msg"] == "weir: serving the Redis protocol"
	}
	if !resp {
		t.Errorf("no record of the RESP listener: %v", recs)
	}
	grpc, _ := started["grpc"].(string)
	if !strings.HasPrefix(grpc, "127.0.0.1:") {
		t.Errorf(`grpc=%q, want the address alone`, grpc)
	}
	for k, v := range started {
		if s, ok := v.(string); ok && k != "msg" && strings.HasPrefix(strings.ToLower(s), strings.ToLower(k)+" ") {
			t.Errorf("attribute %s=%q repeats its name", k, s)
		}
	}
	if d, _ := started["dashboard"].(string); !strings.HasPrefix(d, "http://127.0.0.1:") {
		t.Errorf("dashboard=%q, want its URL", d)
	}
}

// TestServeLogFormatJSONErrors: a start-up failure under --log-format json
// is an ERROR record, not a plain line.
func TestServeLogFormatJSONErrors(t *testing.T) {
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	code := serve(context.Background(), []string{"--log-format", "json", "--config", "/nonexistent/weir.yaml"},
		stdout, stderr, func(string) (string, bool) { return "", false }, nil)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr.String())
	}
	recs := jsonLines(t, stderr.String())
	if len(recs) == 0 || recs[len(recs)-1]["level"] != "ERROR" || !strings.Contains(recs[len(recs)-1]["msg"].(string), "/nonexistent/weir.yaml") {
		t.Fatalf("want an ERROR record naming the file: %v", recs)
	}
}

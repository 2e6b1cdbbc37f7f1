package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
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

// TestServeAsPeerLogFormatJSON: as envoyproxy/ratelimit with
// LOG_FORMAT=json, every line weir writes, from the first start-up notice
// to the last record, is JSON, and nothing goes to stdout: when it starts
// and serves, and when it refuses the environment.
func TestServeAsPeerLogFormatJSON(t *testing.T) {
	rds := redistest.Standalone(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "rl.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0",
		"LOG_FORMAT": "json", "LOG_LEVEL": "info", "RUNTIME_ROOT": root,
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr,
		// Each is named at start-up: USE_STATSD unset, the others set.
		"RUNTIME_WATCH_ROOT": "true", "REDIS_TIMEOUT": "0", "REDIS_TLS_CACERT": "/ca.pem",
		"WEIR_SHUTDOWN_DELAY": "0",
	}
	t.Run("serving", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stdout, stderr := &syncBuffer{}, &syncBuffer{}
		done := make(chan int, 1)
		go func() { done <- serve(ctx, []string{"--envoy-compat"}, stdout, stderr, envLookup(env), nil) }()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(stderr.String(), "weir serve started") {
			select {
			case code := <-done:
				t.Fatalf("exit %d: %s", code, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no start-up record after 20s: %q", stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if code := <-done; code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		if stdout.String() != "" {
			t.Errorf("LOG_FORMAT=json wrote to stdout: %q", stdout.String())
		}
		named := map[string]bool{}
		for _, r := range jsonLines(t, stderr.String()) {
			if v, ok := r["variable"].(string); ok {
				if r["level"] != "WARN" || r["detail"] == "" {
					t.Errorf("notice %v: want a WARN record with its detail", r)
				}
				named[v] = true
			}
		}
		for _, v := range []string{"USE_STATSD", "RUNTIME_WATCH_ROOT", "REDIS_TIMEOUT", "REDIS_TLS_CACERT"} {
			if !named[v] {
				t.Errorf("no start-up notice naming %s in %s", v, stderr.String())
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		refused := map[string]string{"USE_STATSD": "true"}
		for k, v := range env {
			refused[k] = v
		}
		stdout, stderr := &syncBuffer{}, &syncBuffer{}
		if code := serve(context.Background(), []string{"--envoy-compat"}, stdout, stderr, envLookup(refused), nil); code != 1 {
			t.Fatalf("exit %d, want 1: %s", code, stderr.String())
		}
		if stdout.String() != "" {
			t.Errorf("LOG_FORMAT=json wrote to stdout: %q", stdout.String())
		}
		recs := jsonLines(t, stderr.String())
		last := recs[len(recs)-1]
		if msg, _ := last["msg"].(string); last["level"] != "ERROR" || !strings.Contains(msg, "USE_STATSD") {
			t.Fatalf("last record %v: want an ERROR naming USE_STATSD", last)
		}
		if len(recs) < 2 {
			t.Errorf("no notices before the refusal: %v", recs)
		}
	})
	t.Run("bad argument", func(t *testing.T) {
		stderr := &syncBuffer{}
		if code := serve(context.Background(), []string{"--envoy-compat", "stray"}, io.Discard, stderr, envLookup(env), nil); code != 2 {
			t.Fatalf("exit %d, want 2: %s", code, stderr.String())
		}
		recs := jsonLines(t, stderr.String())
		if last := recs[len(recs)-1]; last["level"] != "ERROR" || !strings.Contains(last["msg"].(string), "stray") {
			t.Fatalf("last record %v: want an ERROR naming the argument", last)
		}
	})
}

// TestServeGRPCLogJSON: under --log-format json, grpc-go's own log lines
// (here its line about a client that does not speak HTTP/2, shown with
// GRPC_GO_LOG_SEVERITY_LEVEL=info as grpc-go reads it) are JSON
// records on weir's stderr too.
func TestServeGRPCLogJSON(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	env := map[string]string{"WEIR_SHUTDOWN_DELAY": "0", "GRPC_GO_LOG_SEVERITY_LEVEL": "info"}
	grpcAddr := freeAddr(t)
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--log-format", "json", "--http", "127.0.0.1:0", "--grpc", grpcAddr},
			stdout, stderr, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, nil)
	}()
	deadline := time.Now().Add(20 * time.Second)
	var grpcRec map[string]any
	for grpcRec == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no grpc-go record after 20s: stderr %q", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
		if !strings.Contains(stderr.String(), "weir serve started") {
			continue
		}
		// A client that does not send the HTTP/2 preface.
		if c, err := net.Dial("tcp", grpcAddr); err == nil {
			c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			c.Close()
		}
		for _, r := range jsonLines(t, stderr.String()) {
			if m, _ := r["msg"].(string); r["source"] == "grpc-go" && strings.Contains(m, "ServerTransport") {
				grpcRec = r
			}
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	jsonLines(t, stderr.String()) // every line, to the end
	if msg, _ := grpcRec["msg"].(string); grpcRec["level"] != "INFO" || !strings.Contains(msg, "bogus greeting") {
		t.Errorf("grpc-go's record: %v", grpcRec)
	}
}

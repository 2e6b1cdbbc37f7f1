package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestServeStartsWithRedisDown: weir serve pointed at a Redis that is down
// starts all the same, answers by on_error, and once Redis starts, its
// decisions reach Redis without a restart.
func TestServeStartsWithRedisDown(t *testing.T) {
	r := redistest.Standalone(t)
	r.Stop()
	base, line, _ := startServe(t, nil, "--http", "127.0.0.1:0", "--grpc", "off", "--log-level", "error", "--redis", "redis://"+r.Addr)
	if !strings.Contains(line[3], "redis standalone "+r.Addr) {
		t.Fatalf("store: %q", line[3])
	}
	decide := func() (int, map[string]any) {
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"rule":"login","key":"192.0.2.1","hits":1}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d map[string]any
		json.NewDecoder(resp.Body).Decode(&d)
		return resp.StatusCode, d
	}
	if code, d := decide(); code != 200 || d["fallback"] == nil {
		t.Fatalf("check with Redis down: %d %v; want an on_error fallback", code, d)
	}
	r.Start()
	end := time.Now().Add(30 * time.Second)
	for {
		code, d := decide()
		if code == 200 && d["fallback"] == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("decisions did not reach Redis after it started: %d %v", code, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n, err := r.Do("DBSIZE"); err != nil || n.(int64) == 0 {
		t.Fatalf("no keys in Redis: %v %v", n, err)
	}
}

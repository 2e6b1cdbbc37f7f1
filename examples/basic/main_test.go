package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

func TestBasic(t *testing.T) {
	var now atomic.Int64 // the store's clock, in Unix nanoseconds
	now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(func() time.Time { return time.Unix(0, now.Load()) })))
	srv := httptest.NewServer(newHandler(lim))
	defer srv.Close()

	get := func() *http.Response {
		t.Helper()
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := 0; i < 10; i++ {
		resp := get()
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hello, world\n" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
		if i == 0 {
			if got := resp.Header.Get("RateLimit-Policy"); got != `"per-ip";q=10;w=1` {
				t.Errorf("RateLimit-Policy = %q", got)
			}
			if got := resp.Header.Get("RateLimit"); got != `"per-ip";r=9;t=1` {
				t.Errorf("RateLimit = %q", got)
			}
		}
	}
	resp := get()
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("11th request: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	now.Add(int64(100 * time.Millisecond)) // GCRA frees one request every 100ms
	resp = get()
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after 100ms: %d", resp.StatusCode)
	}
}

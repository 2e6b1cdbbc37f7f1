package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// commandCalls returns how many times Redis ran each command since the
// last CONFIG RESETSTAT, commands run inside scripts included.
func commandCalls(t *testing.T, srv *redistest.Server) map[string]int {
	t.Helper()
	v, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(v.(string), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

// TestBlockedCheckReadsOnlyTheBox: while a penalty box that outlasts the
// limit's state holds, a check is one GET of the box key; the state (here a
// sliding log's ZSET) is not touched.
func TestBlockedCheckReadsOnlyTheBox(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}})
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.SlidingLog, Rate: 50, Period: time.Minute, Block: 10 * time.Minute}
	if r, _ := s.Take(ctx, "k", l, 50); !r.Allowed {
		t.Fatal("the first 50 were rejected")
	}
	r, err := s.Take(ctx, "k", l, 1) // starts the box
	if err != nil || r.Allowed || r.BlockedUntil.IsZero() {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		r, err := s.Take(ctx, "k", l, 1)
		if err != nil || r.Allowed || r.RetryAfter <= 9*time.Minute || r.RetryAfter != r.ResetAfter {
			t.Fatalf("blocked check %d: %+v %v", i, r, err)
		}
	}
	calls := commandCalls(t, srv)
	for _, cmd := range []string{"zrangebyscore", "zremrangebyscore", "zcard", "zrange", "zadd", "set", "pexpire"} {
		if calls[cmd] != 0 {
			t.Errorf("blocked checks ran %s %d times: %v", cmd, calls[cmd], calls)
		}
	}
	if calls["get"] != 10 {
		t.Errorf("blocked checks ran GET %d times, want 10 (the box key): %v", calls["get"], calls)
	}
}

package redisstore

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// TestClockSkew shows that two limiter instances agree exactly however far
// apart their own clocks are, because the only clock a decision reads is
// Redis TIME:
//
//  1. With Config.Clock unset, no client time reaches Redis at all: MONITOR
//     shows the scripts' time argument empty on every call.
//  2. Two Stores on one key give RetryAfter, ResetAfter and BlockedUntil
//     that name the same instants on Redis's clock, to the microsecond.
//  3. The contrast: two Stores that pass their own clocks to the scripts
//     (Config.Clock, 30s apart, as a limiter that trusts app-server time
//     would) disagree by the 30s skew. The check in 2 would catch that.
func TestClockSkew(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()

	// 1. MONITOR every command while two clock-less stores decide.
	mon, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	if _, err := mon.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	monr := bufio.NewReader(mon)
	if line, err := monr.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q %v", line, err)
	}

	a := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "skew"})
	b := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "skew"})
	for _, algo := range []weir.Algorithm{weir.GCRA, weir.FixedWindow, weir.SlidingLog, weir.SlidingWindow, weir.TokenBucket, weir.LeakyBucket, weir.Concurrency} {
		l := weir.Limit{Algorithm: algo, Rate: 5, Period: time.Minute, Block: 90 * time.Second}
		agree(t, ctx, a, b, "shared-"+string(algo), l, true)
	}
	// Every FCALL/EVALSHA/EVAL sent so far must carry an empty time argument.
	if _, err := srv.Do("ECHO", "skew-test-end"); err != nil {
		t.Fatal(err)
	}
	mon.SetReadDeadline(time.Now().Add(30 * time.Second))
	evals := 0
	for {
		line, err := monr.ReadString('\n')
		if err != nil {
			t.Fatalf("MONITOR: %v", err)
		}
		if strings.Contains(line, `"skew-test-end"`) {
			break
		}
		args := monitorArgs(line)
		if len(args) < 4 || (args[0] != "FCALL" && args[0] != "EVALSHA" && args[0] != "EVAL") {
			continue
		}
		evals++
		// FCALL function numkeys key... now ... (EVALSHA sha, EVAL source)
		nk := 2
		if args[2] != "2" {
			t.Fatalf("unexpected script call %q", line)
		}
		if now := args[3+nk]; now != "" {
			t.Fatalf("a store without a test clock sent time %q to Redis: %q", now, line)
		}
	}
	if evals < 50 {
		t.Fatalf("MONITOR saw only %d script calls", evals)
	}

	// 3. The contrast: client clocks 30s apart passed to the scripts.
	local := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "naive", Clock: time.Now})
	skewed := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "naive", Clock: func() time.Time { return time.Now().Add(30 * time.Second) }})
	agree(t, ctx, local, skewed, "naive", weir.Limit{Algorithm: weir.GCRA, Rate: 5, Period: time.Minute}, false)
}

// agree saturates key through a, then asks a and b in turn and checks that
// their answers name the same instants on the scripts' clock: a decision at
// script time now with RetryAfter r means "at now+r". With want false it
// instead requires a disagreement of about 30s.
func agree(t *testing.T, ctx context.Context, a, b *Store, key string, l weir.Limit, want bool) {
	t.Helper()
	for {
		d, _, err := a.take(ctx, &weir.Request{Key: key, Limit: l, N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
	}
	for i := range 5 {
		for _, pair := range [][2]*Store{{a, b}, {b, a}} {
			da, nowA, err := pair[0].take(ctx, &weir.Request{Key: key, Limit: l, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			db, nowB, err := pair[1].take(ctx, &weir.Request{Key: key, Limit: l, N: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !want {
				// The skewed instance sees a state 30s older or younger:
				// it admits while the other rejects, or their RetryAfter
				// for the same real moment differ by the skew.
				if diff := da.RetryAfter - db.RetryAfter; da.Allowed == db.Allowed && diff < 29e6 && diff > -29e6 {
					t.Fatalf("naive stores with clocks 30s apart agree (%+v, %+v); the skew check is not sensitive", da, db)
				}
				return
			}
			if da.Allowed || db.Allowed {
				t.Fatalf("%s %v: admitted while exhausted: %+v %+v", key, l, da, db)
			}
			retryAt := [2]int64{nowA + da.RetryAfter, nowB + db.RetryAfter}
			resetAt := [2]int64{nowA + da.ResetAfter, nowB + db.ResetAfter}
			if retryAt[0] != retryAt[1] || resetAt[0] != resetAt[1] || da.BlockedUntil != db.BlockedUntil || da.Remaining != db.Remaining {
				t.Fatalf("%s %v, round %d: instances disagree:\n %+v at %d\n %+v at %d", key, l, i, da, nowA, db, nowB)
			}
			if gap := nowB - nowA; gap < 0 || gap > int64(time.Second/time.Microsecond) {
				t.Fatalf("%s: Redis TIME went from %d to %d between two calls", key, nowA, nowB)
			}
		}
	}
}

// monitorArgs splits a MONITOR line into its quoted arguments.
func monitorArgs(line string) []string {
	var args []string
	for {
		i := strings.IndexByte(line, '"')
		if i < 0 {
			return args
		}
		line = line[i+1:]
		var b strings.Builder
		for len(line) > 0 && line[0] != '"' {
			if line[0] == '\\' && len(line) > 1 {
				b.WriteByte(line[1])
				line = line[2:]
				continue
			}
			b.WriteByte(line[0])
			line = line[1:]
		}
		if len(line) == 0 {
			return args
		}
		args = append(args, b.String())
		line = line[1:]
	}
}

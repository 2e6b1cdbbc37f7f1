package policy

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestLimitExtrasBadInput: escalating penalties, calendar quotas and warm-up
// written wrong are each named at their line and column.
func TestLimitExtrasBadInput(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"empty block list", "rules:\n  - {name: r, limit: 5/m, block: []}\n",
			[]string{`2:34: block list is empty: write one box (block: 1m) or boxes that grow ([1m, 10m, 1h])`}},
		{"unsorted block list", "rules:\n  - name: r\n    limit: 5/m\n    block: [1m, 1h, 10m]\n    forget_after: 24h\n",
			[]string{`4:21: block list must grow, shortest first: 10m0s comes after 1h0m0s`}},
		{"block list without forget_after", "rules:\n  - name: r\n    limit: 5/m\n    block: [1m, 10m]\n",
			[]string{`4:12: invalid limit "5/m": a block list of several boxes needs forget_after: how long after a box its history lasts`}},
		{"forget_after without a list", "rules:\n  - name: r\n    limit: 5/m\n    block: 1m\n    forget_after: 1h\n",
			[]string{`5:19: invalid limit "5/m": forget_after needs a block list of several boxes, such as [1m, 10m, 1h]`}},
		{"unknown time zone", "rules:\n  - name: r\n    limit: 10000/month\n    timezone: Mars/Olympus\n",
			[]string{`4:15: invalid limit "10000/month": unknown time zone "Mars/Olympus" (want an IANA name such as UTC or Asia/Shanghai)`}},
		{"month on gcra", "rules:\n  - name: r\n    limit: 10000/month\n    algorithm: gcra\n",
			[]string{`4:16: invalid limit "10000/month": calendar periods (/day with a time zone, /week, /month) apply to fixed_window, not gcra`}},
		{"week on a sliding window", "rules:\n  - {name: r, limit: 5/week, algorithm: sliding_window}\n",
			[]string{`2:41: invalid limit "5/week": calendar periods (/day with a time zone, /week, /month) apply to fixed_window, not sliding_window`}},
		{"bad reset_at", "rules:\n  - name: r\n    limit: 100/day\n    reset_at: \"25:00\"\n",
			[]string{`4:15: reset_at "25:00" is not a time of day such as "02:00" or "23:30:15"`}},
		{"timezone on an hourly limit", "rules:\n  - name: r\n    limit: 100/h\n    algorithm: fixed_window\n    timezone: Asia/Shanghai\n",
			[]string{`5:15: invalid limit "100/h": timezone and reset_at apply to calendar windows: a limit per day, week or month`}},
		{"warmup too long", "rules:\n  - name: r\n    limit: 100/s\n    algorithm: token_bucket\n    warmup: 48h\n",
			[]string{`5:13: warmup 48h0m0s is longer than a day: a key idle that long goes cold again long before it warms up`}},
		{"warmup on a window", "rules:\n  - name: r\n    limit: 100/s\n    algorithm: fixed_window\n    warmup: 10m\n",
			[]string{`5:13: invalid limit "100/s": warmup applies to token_bucket and gcra, not fixed_window`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "w.yaml")
			if err == nil {
				_, err = New(cfg, memstore.New())
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %v; want a *config.Error", err)
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, (&config.Error{Problems: []config.Problem{p}}).Error()[len("config:"):])
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("problems:\n got %q\nwant %q", got, c.want)
			}
		})
	}
}

// TestEscalatingBlockFromYAML: block: [1m, 10m, 1h] with forget_after
// reaches the store, and a Reset (the admin API's unblock) forgets the
// history.
func TestEscalatingBlockFromYAML(t *testing.T) {
	cfg, err := Parse([]byte("rules:\n  - name: login\n    identity: header:X-User\n    limit: 1/s\n    algorithm: fixed_window\n    block: [1m, 10m, 1h]\n    forget_after: 24h\n"), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(storetest.Epoch)
	p, err := New(cfg, memstore.New(memstore.WithClock(clock.Now)), WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	offend := func(want time.Duration) {
		t.Helper()
		if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "alice", N: 1}); !rr.Result.Allowed {
			t.Fatalf("the first of a new window: %+v", rr.Result)
		}
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: "login", Key: "alice", N: 1})
		if err != nil {
			t.Fatal(err)
		}
		start := clock.Now()
		if rr.Result.Allowed || rr.Result.RetryAfter != want || !rr.Result.BlockedUntil.Equal(start.Add(want)) {
			t.Fatalf("got %+v; want a %v box", rr.Result, want)
		}
		clock.Advance(want)
	}
	offend(time.Minute)
	offend(10 * time.Minute)
	offend(time.Hour)
	offend(time.Hour)
	if err := p.Reset(ctx, "login", "alice"); err != nil {
		t.Fatal(err)
	}
	offend(time.Minute)
}

// TestCalendarFromYAML: limit: N/day with timezone and reset_at is a
// calendar day counted in a fixed_window, ResetAfter running to the next
// 02:00 in Shanghai.
func TestCalendarFromYAML(t *testing.T) {
	cfg, err := Parse([]byte("rules:\n  - name: quota\n    identity: header:X-Key\n    limit: 2/day\n    timezone: Asia/Shanghai\n    reset_at: \"02:00\"\n"), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// 2030-01-01 17:00Z is 01:00 in Shanghai: the day ends at 18:00Z.
	clock := storetest.NewClock(time.Date(2030, 1, 1, 17, 0, 0, 0, time.UTC))
	p, err := New(cfg, memstore.New(memstore.WithClock(clock.Now)), WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := p.Limit("quota", ""); l.Algorithm != "fixed_window" || l.Calendar != 1 || l.ResetAt != 2*time.Hour {
		t.Fatalf("limit %+v", l)
	}
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: "quota", Key: "k", N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rr.Result.Allowed != want || rr.Result.ResetAfter != time.Hour {
			t.Fatalf("take %d: %+v", i, rr.Result)
		}
	}
	clock.Advance(time.Hour)
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "quota", Key: "k", N: 1}); !rr.Result.Allowed || rr.Result.ResetAfter != 24*time.Hour {
		t.Fatalf("the next day: %+v", rr.Result)
	}
}

// TestReloadKeepsRulesOnLimitExtrasBadInput: a reload that brings any of the
// bad inputs above is refused, each problem named, and the rules in force
// stay.
func TestReloadKeepsRulesOnLimitExtrasBadInput(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weir.yaml")
	write(t, path, "rules:\n  - {name: a, limit: 10000/month, timezone: Asia/Shanghai, reset_at: \"02:00\"}\n")
	w := startWatch(t, path)
	before := w.h.Load()
	write(t, path, `rules:
  - {name: a, limit: 10000/month, timezone: Mars/Olympus}
  - {name: b, limit: 10/month, algorithm: gcra}
  - {name: c, limit: 5/m, block: [], algorithm: sliding_log}
  - {name: d, limit: 5/m, block: [1h, 10m], forget_after: 24h}
  - {name: e, limit: 5/s, algorithm: gcra, warmup: 72h}
`)
	err := w.h.Reload()
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 5 {
		t.Fatalf("reload: %v; want 5 problems", err)
	}
	for i, p := range ce.Problems {
		if p.Line != i+2 || p.Column == 0 {
			t.Errorf("problem %d at %d:%d, want line %d: %s", i, p.Line, p.Column, i+2, p.Message)
		}
	}
	if w.h.Load() != before {
		t.Fatal("a bad reload replaced the rules")
	}
}

// TestRuleInfoLimitExtras: GET /v1/rules shows the block list, forget_after,
// the calendar's zone and start, and the warm-up.
func TestRuleInfoLimitExtras(t *testing.T) {
	cfg, err := Parse([]byte(`rules:
  - {name: a, limit: 5/m, algorithm: sliding_log, block: [1m, 10m, 1h], forget_after: 24h}
  - {name: b, limit: 100/month, timezone: Asia/Shanghai, reset_at: "02:00"}
  - {name: c, limit: 10/s, algorithm: gcra, warmup: 10m}
`), "w.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	rs := p.Rules()
	if got := rs[0]; !reflect.DeepEqual(got.Blocks, []string{"1m0s", "10m0s", "1h0m0s"}) || got.ForgetAfter != "24h0m0s" || got.Block != "1m0s" {
		t.Errorf("a: %+v", got)
	}
	if got := rs[1]; got.Timezone != "Asia/Shanghai" || got.ResetAt != "02:00:00" || got.Algorithm != "fixed_window" || got.Limit != "100/month" {
		t.Errorf("b: %+v", got)
	}
	if got := rs[2]; got.Warmup != "10m0s" || got.Blocks != nil || got.Timezone != "" {
		t.Errorf("c: %+v", got)
	}
}

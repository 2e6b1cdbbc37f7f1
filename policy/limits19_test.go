package policy

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestIssue19BadInput: escalating penalties, calendar quotas and warm-up
// written wrong are each named at their line and column.
func TestIssue19BadInput(t *testing.T) {
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
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "w.yaml")
			if err == nil {
				_, err = New(cfg, memstore.New())
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v; want a *ConfigError", err)
			}
			var got []string
			for _, p := range ce.Problems {
				got = append(got, p.format("")[len("config:"):])
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
		if rr, _ := p.CheckKey(ctx, "login", "alice", 1); !rr.Result.Allowed {
			t.Fatalf("the first of a new window: %+v", rr.Result)
		}
		rr, err := p.CheckKey(ctx, "login", "alice", 1)
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

package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
)

// nearCount runs n counting checks of rule (const identity) and returns
// the 1-based indices of those IsNearLimit reports.
func nearCount(t *testing.T, p *Policy, rule string, n int) []int {
	t.Helper()
	var near []int
	for i := 1; i <= n; i++ {
		rr, err := p.CheckKey(ctx, KeyRequest{Rule: rule, Key: "k", N: 1})
		if err != nil {
			t.Fatal(err)
		}
		if rr.IsNearLimit() {
			near = append(near, i)
		}
	}
	return near
}

// TestNearLimit: with a 10/m limit and near_limit 80%, the 8th, 9th and
// 10th decisions leave the key at 80%, 90% and 100% of its limit and are
// near it; the 1st to 7th are not, nor the 11th, which is limited (it is
// counted as limited, not as near). The default is 80%; a rule's
// near_limit overrides the global one; off and 0 turn it off.
func TestNearLimit(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []int
		ratio     float64
	}{
		{"default 80%", "rules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", []int{8, 9, 10}, 0.8},
		{"global percent", "near_limit: 80%\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", []int{8, 9, 10}, 0.8},
		{"global fraction", "near_limit: 0.9\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", []int{9, 10}, 0.9},
		{"70% exactly", "near_limit: 70%\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", []int{7, 8, 9, 10}, 0.7},
		{"rule overrides global", "near_limit: 0.9\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window, near_limit: 50%}\n", []int{5, 6, 7, 8, 9, 10}, 0.5},
		{"rule turns it off", "rules:\n  - {name: r, limit: 10/m, algorithm: fixed_window, near_limit: off}\n", nil, 0},
		{"global off", "near_limit: off\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", nil, 0},
		{"global 0", "near_limit: 0\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window}\n", nil, 0},
		{"rule on while global off", "near_limit: off\nrules:\n  - {name: r, limit: 10/m, algorithm: fixed_window, near_limit: 100%}\n", []int{10}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustPolicy(t, c.doc, memstore.New(memstore.WithClock(newClock().Now)))
			if got := nearCount(t, p, "r", 11); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("near-limit decisions %v, want %v", got, c.want)
			}
			if got := p.Rules()[0].NearLimit; got != c.ratio {
				t.Fatalf("RuleInfo.NearLimit = %v, want %v", got, c.ratio)
			}
		})
	}
}

// TestNearLimitNotPeeksNorSkips: a peek (0 hits), a skipped rule and a
// rejection are never near the limit, even when the key is past it.
func TestNearLimitNotPeeksNorSkips(t *testing.T) {
	p := mustPolicy(t, "rules:\n  - {name: r, identity: header:X-Key, limit: 2/m, algorithm: fixed_window}\n",
		memstore.New(memstore.WithClock(newClock().Now)))
	for i := range 2 {
		if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); rr.IsNearLimit() != (i == 1) {
			t.Fatalf("decision %d: near %v", i+1, rr.IsNearLimit())
		}
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 0}); rr.Result.Remaining != 0 || rr.IsNearLimit() {
		t.Fatalf("a peek at a full key: %+v, near %v", rr.Result, rr.IsNearLimit())
	}
	v := p.Check(ctx, req("GET", "/"))
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); rr.Result.Allowed || rr.IsNearLimit() {
		t.Fatalf("a rejection: %+v, near %v", rr.Result, rr.IsNearLimit())
	}
	if !v.Results[0].Skipped || v.Results[0].IsNearLimit() {
		t.Fatalf("skipped rule: %+v", v.Results[0])
	}
	// Exact at huge limits too, with no float rounding nor overflow: 80%
	// of 2^62 is 4q+3.2 where q = 2^62/5 (2^62 = 5q+4).
	const l, q = int64(1) << 62, (int64(1) << 62) / 5
	at := func(used int64) bool {
		return NearLimit(weir.Result{Allowed: true, Granted: 1, Limit: l, Remaining: l - used}, 0.8)
	}
	if !at(4*q+4) || at(4*q+3) {
		t.Fatalf("near at 4q+4: %v, at 4q+3: %v; want true, false", at(4*q+4), at(4*q+3))
	}
}

// TestNearLimitConfigErrors: a bad near_limit is reported at its line and
// column, globally and in a rule, with the value.
func TestNearLimitConfigErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"near_limit: 1.5\nrules: []\n", `1:13: near_limit "1.5" must be a share`},
		{"near_limit: 120%\nrules: []\n", `1:13: near_limit "120%" must be a share`},
		{"near_limit: -0.1\nrules: []\n", `1:13: near_limit "-0.1" must be a share`},
		{"near_limit: lots\nrules: []\n", `1:13: near_limit "lots" must be a share`},
		{"near_limit: [1]\nrules: []\n", `1:13: near_limit must be a single value`},
		{"rules:\n  - name: r\n    limit: 10/m\n    near_limit: 80 %\n", `4:17: near_limit "80 %" must be a share`},
		{"rules:\n  - name: r\n    limit: 10/m\n    near_limit: NaN\n", `4:17: near_limit "NaN" must be a share`},
	} {
		_, err := Parse([]byte(c.doc), "w.yaml")
		var ce *config.Error
		if !errors.As(err, &ce) {
			t.Fatalf("%q: got %v, want a *config.Error", c.doc, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%q: got %v, want %s", c.doc, err, c.want)
		}
	}
	// A Config built in Go is checked by New.
	if _, err := New(&config.Config{NearLimit: "2", Rules: []config.RuleConfig{{Name: "r", Limit: "1/s"}}}, nil); err == nil || !strings.Contains(err.Error(), `near_limit "2"`) {
		t.Fatalf("New: %v", err)
	}
}

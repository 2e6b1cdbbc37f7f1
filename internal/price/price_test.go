package price

import (
	"errors"
	"strings"
	"testing"
)

func TestCostRoundsUpAndIsExact(t *testing.T) {
	// gpt-4o-like prices: 2.50 input, 1.25 cached, 10 output per million.
	m := Model{Input: 2_500_000, CachedInput: 1_250_000, Output: 10_000_000, Reasoning: 10_000_000}
	for _, c := range []struct {
		u    Usage
		want int64
	}{
		{Usage{Input: 1_000_000}, 2_500_000},
		{Usage{Input: 1}, 3}, // 2.5 micro-units rounds up
		{Usage{Input: 2}, 5},
		{Usage{Input: 1000, CachedInput: 2000, Output: 300, Reasoning: 700}, 2500 + 2500 + 3000 + 7000},
		{Usage{}, 0},
	} {
		got, err := Cost(m, c.u)
		if err != nil || got != c.want {
			t.Errorf("Cost(%+v) = %d, %v; want %d", c.u, got, err, c.want)
		}
	}
	if _, err := Cost(m, Usage{Output: -1}); err == nil {
		t.Error("a negative count was priced")
	}
	if _, err := Cost(Model{Output: MaxPerMillion}, Usage{Output: MaxTokens, Input: MaxTokens}); err != nil {
		t.Errorf("the largest usage at the largest price: %v", err)
	}
}

// TestCacheWrites: cache writes cost their own price, and the estimate
// prices a prompt at the highest input price, so that a prompt written
// to the cache whole stays within it.
func TestCacheWrites(t *testing.T) {
	// Claude-like: 3 input, 0.30 cache reads, 3.75 cache writes, 15 output.
	m := Model{Input: 3_000_000, CachedInput: 300_000, Output: 15_000_000, Reasoning: 15_000_000, CacheWrite: 3_750_000}
	got, err := Cost(m, Usage{Input: 100, CachedInput: 1000, CacheWrite: 2000, Output: 10})
	if want := int64(300 + 300 + 7500 + 150); err != nil || got != want {
		t.Errorf("Cost = %d, %v; want %d", got, err, want)
	}
	est, err := Estimate(m, Usage{Input: 2000, Output: 10})
	if want := int64(7500 + 150); err != nil || est != want {
		t.Errorf("Estimate = %d, %v; want %d", est, err, want)
	}
	for _, u := range []Usage{{CacheWrite: 2000, Output: 10}, {Input: 1000, CacheWrite: 1000, Output: 10}, {CachedInput: 2000, Output: 10}} {
		if c, _ := Cost(m, u); c > est {
			t.Errorf("usage %+v costs %d, more than the estimate %d", u, c, est)
		}
	}
	x, err := Compile("cache_write_tokens * cache_write_price / 1000000 + input_tokens")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := x.Eval(m, Usage{Input: 5, CacheWrite: 2000}, false); err != nil || n != 7500+5 {
		t.Errorf("cost_expr with cache writes = %d, %v", n, err)
	}
}

func TestEstimateIsAnUpperBound(t *testing.T) {
	m := Model{Input: 3_000_000, CachedInput: 300_000, Output: 15_000_000, Reasoning: 20_000_000}
	est, err := Estimate(m, Usage{Input: 1000, Output: 500})
	if err != nil {
		t.Fatal(err)
	}
	// Any split of 1000 input and at most 500 output costs no more.
	for _, u := range []Usage{{Input: 1000, Output: 500}, {CachedInput: 1000, Reasoning: 500}, {Input: 400, CachedInput: 600, Output: 100, Reasoning: 400}} {
		c, _ := Cost(m, u)
		if c > est {
			t.Errorf("usage %+v costs %d, more than the estimate %d", u, c, est)
		}
	}
	if est != 3000+10000 {
		t.Errorf("estimate %d, want %d", est, 13000)
	}
}

func TestParseAmount(t *testing.T) {
	for in, want := range map[string]int64{"10": 10_000_000, "2.5": 2_500_000, "0.000001": 1, ".5": 500_000, "0": 0} {
		if got, err := ParseAmount(in); err != nil || got != want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".", "1.", "1.0000001", "-1", "1e3", "ten", "99999999999999999999"} {
		if _, err := ParseAmount(in); err == nil {
			t.Errorf("ParseAmount(%q) succeeded", in)
		}
	}
	if _, err := ParsePerMillion("1000001"); err == nil {
		t.Error("a price above the bound was accepted")
	}
	if Format(2_500_000) != "2.5" || Format(125) != "0.000125" || Format(3_000_000) != "3" {
		t.Errorf("Format: %s %s %s", Format(2_500_000), Format(125), Format(3_000_000))
	}
}

func TestLookupUnknownModel(t *testing.T) {
	tb := &Table{Models: map[string]Model{"a": {Input: 1}}}
	if _, err := tb.Lookup("b"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model: %v", err)
	}
	tb.Unknown = &Model{Input: 9}
	if m, err := tb.Lookup("b"); err != nil || m.Input != 9 {
		t.Errorf("unknown model priced by default: %+v %v", m, err)
	}
}

func TestCompileAndEval(t *testing.T) {
	x, err := Compile("(input_tokens * input_price + output_tokens * output_price) / 1000000 + (estimate ? 0 : 1)")
	if err != nil {
		t.Fatal(err)
	}
	m := Model{Input: 2_000_000, Output: 8_000_000}
	got, err := x.Eval(m, Usage{Input: 1000, Output: 100}, false)
	if err != nil || got != 2000+800+1 {
		t.Errorf("Eval = %d, %v; want 2801", got, err)
	}
	if got, _ := x.Eval(m, Usage{Input: 1000, Output: 100}, true); got != 2800 {
		t.Errorf("Eval estimate = %d, want 2800", got)
	}
	for src, want := range map[string]string{
		"input_tokens + foo":             "undeclared reference to 'foo'",
		"input_tokens +":                 "column",
		"double(input_tokens)":           "must give an int",
		"":                               "empty",
		"model":                          "must give an int",
		strings.Repeat("1+", 2000) + "1": "more than",
	} {
		_, err := Compile(src)
		var ee *ExprError
		if !errors.As(err, &ee) || !strings.Contains(err.Error(), want) {
			t.Errorf("Compile(%.30q) = %v; want an ExprError with %q", src, err, want)
		}
	}
	neg, _ := Compile("0 - input_tokens")
	if _, err := neg.Eval(m, Usage{Input: 1}, false); err == nil {
		t.Error("a negative cost was accepted")
	}
	div, _ := Compile("input_tokens / output_tokens")
	if _, err := div.Eval(m, Usage{Input: 1}, false); err == nil {
		t.Error("a division by zero gave a cost")
	}
}

// Package price turns token usage into money: a price table per model, in
// micro-units of a currency (a millionth of a dollar, euro...), and cost
// expressions (CEL) over a request's usage. Package policy compiles a
// weir.yaml's prices and cost_expr with it; nothing else imports it, so
// that cel-go stays out of the middleware packages.
package price

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Micro is the number of micro-units in one unit of a currency.
const Micro = 1_000_000

// MaxPerMillion bounds a price per million tokens: 1,000,000 units.
const MaxPerMillion = 1_000_000 * Micro

// MaxTokens bounds every token count of a Usage.
const MaxTokens = 1 << 40

// Model is one model's prices, in micro-units per million tokens.
// CacheWrite prices the input tokens written to the provider's prompt
// cache (Anthropic's cache_creation_input_tokens).
type Model struct {
	Input, CachedInput, Output, Reasoning, CacheWrite int64
}

// Usage is what a request used or may use. Its counts are disjoint:
// Input excludes the cached input tokens and the cache writes, Output the
// reasoning tokens.
type Usage struct {
	Model                                 string
	Input, CachedInput, Output, Reasoning int64
	CacheWrite                            int64
}

// Table is a price table. Unknown, when not nil, prices the models the
// table does not list; nil refuses them.
type Table struct {
	Currency string
	Models   map[string]Model
	Unknown  *Model
}

// ErrUnknownModel is returned for a model the table neither lists nor
// prices by default.
var ErrUnknownModel = errors.New("unknown model")

// Lookup returns the prices of model.
func (t *Table) Lookup(model string) (Model, error) {
	if m, ok := t.Models[model]; ok {
		return m, nil
	}
	if t.Unknown != nil {
		return *t.Unknown, nil
	}
	if len(model) > 64 {
		model = model[:64] + "…"
	}
	return Model{}, fmt.Errorf("%w %q: the price table does not list it and prices.unknown is refuse", ErrUnknownModel, model)
}

// Cost returns what u costs at m's prices, in micro-units, rounded up:
// the sum of each count times its price per million tokens, over a
// million. It fails for a negative or too large count.
func Cost(m Model, u Usage) (int64, error) {
	counts := [5]int64{u.Input, u.CachedInput, u.Output, u.Reasoning, u.CacheWrite}
	prices := [5]int64{m.Input, m.CachedInput, m.Output, m.Reasoning, m.CacheWrite}
	var sum, x big.Int
	for i, c := range counts {
		if c < 0 || c > MaxTokens {
			return 0, fmt.Errorf("token count %d is out of range (0 to %d)", c, int64(MaxTokens))
		}
		x.SetInt64(c)
		x.Mul(&x, big.NewInt(prices[i]))
		sum.Add(&sum, &x)
	}
	// Round up: a budget never undercounts a fraction of a micro-unit.
	sum.Add(&sum, big.NewInt(Micro-1))
	sum.Quo(&sum, big.NewInt(Micro))
	if !sum.IsInt64() {
		return 0, fmt.Errorf("cost %s micro-units is too large", sum.String())
	}
	return sum.Int64(), nil
}

// Estimate returns the most a request may cost at m's prices before its
// usage is known: its prompt (input, all of it priced at the highest of
// the input, cached input and cache write prices, since any prompt token
// may turn out to be any of them) and its most output (max_tokens × n),
// priced at the higher of the output and reasoning prices, since the
// output may be spent on either.
func Estimate(m Model, u Usage) (int64, error) {
	in := max(m.Input, m.CachedInput, m.CacheWrite)
	out := max(m.Output, m.Reasoning)
	return Cost(Model{Input: in, Output: out}, Usage{Input: u.Input + u.CachedInput + u.CacheWrite, Output: u.Output + u.Reasoning})
}

// ParsePerMillion reads a price per million tokens written as a decimal
// number of units ("2.50", "0.075", "15") into micro-units per million
// tokens, exactly: at most 6 decimals, 0 to MaxPerMillion.
func ParsePerMillion(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, fmt.Errorf("price %q is not a decimal number of currency units per million tokens from 0 to %d with at most 6 decimals, such as 2.50", s, MaxPerMillion/Micro)
	}
	v, err := ParseAmount(s)
	if err != nil || v > MaxPerMillion {
		return bad()
	}
	return v, nil
}

// ParseAmount reads a non-negative decimal amount of units with at most
// 6 decimals ("10", "2.5", "0.000001") as micro-units, exactly.
func ParseAmount(s string) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" && (!dot || frac == "") || len(frac) > 6 || (dot && frac == "") {
		return 0, fmt.Errorf("amount %q is not a decimal number with at most 6 decimals", s)
	}
	for _, part := range []string{whole, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return 0, fmt.Errorf("amount %q is not a decimal number with at most 6 decimals", s)
			}
		}
	}
	var w int64
	if whole != "" {
		var err error
		if w, err = strconv.ParseInt(whole, 10, 64); err != nil || w > math.MaxInt64/Micro-1 {
			return 0, fmt.Errorf("amount %q is too large", s)
		}
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt((frac + "000000")[:6], 10, 64)
	}
	return w*Micro + f, nil
}

// Format renders micro-units as a decimal amount of units, such as
// "2.5" or "0.000125".
func Format(micro int64) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	s := strconv.FormatInt(micro/Micro, 10)
	if f := micro % Micro; f != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", f), "0")
	}
	return sign + s
}

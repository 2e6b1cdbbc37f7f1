package policy

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/price"
	"github.com/weir-dev/weir/policy/config"
)

// Usage is a request's token usage, for the rules that count money
// (budget:) or price usage (cost_expr:). Its counts are disjoint: Input
// excludes the cached input tokens and the cache writes (Anthropic's
// input_tokens already exclude both), Output the reasoning tokens (OpenAI's
// prompt_tokens include its cached tokens and its completion_tokens its
// reasoning tokens: subtract them). Before the response, the estimate is
// the prompt's tokens as Input and max_tokens × n as Output.
type Usage struct {
	Model                                        string
	InputTokens, CachedInputTokens, OutputTokens int64
	ReasoningTokens                              int64
	// CacheWriteTokens are input tokens written to the provider's prompt
	// cache (Anthropic's cache_creation_input_tokens), priced at the
	// model's cache_write price.
	CacheWriteTokens int64
}

type usageKey struct{}

// WithUsage returns ctx carrying the estimate u of the request about to
// be checked: Check prices it for every budget or cost_expr rule the
// request matches, and takes that as the rule's cost before the handler.
// Finish settles each such rule from Charges.Usage, the usage reported.
func WithUsage(ctx context.Context, u Usage) context.Context {
	return context.WithValue(ctx, usageKey{}, u)
}

func (u Usage) internal() price.Usage {
	return price.Usage{Model: u.Model, Input: u.InputTokens, CachedInput: u.CachedInputTokens, Output: u.OutputTokens, Reasoning: u.ReasoningTokens, CacheWrite: u.CacheWriteTokens}
}

// pricer prices a rule's usage: by the table's sum, or by expr.
type pricer struct {
	table *price.Table // nil: no prices section (expr only)
	expr  *price.Expr  // nil: the table's sum
	// currency is a budget rule's (prices.currency); "" for a cost_expr
	// rule with a limit, which counts units, not money.
	currency string
}

// estimate prices the usage estimate u: the table's pessimistic estimate
// (price.Estimate), or expr with estimate true.
func (pr *pricer) estimate(u Usage) (int64, error) { return pr.cost(u, true) }

// actual prices the reported usage u.
func (pr *pricer) actual(u Usage) (int64, error) { return pr.cost(u, false) }

func (pr *pricer) cost(u Usage, estimate bool) (int64, error) {
	var m price.Model
	if pr.table != nil {
		var err error
		if m, err = pr.table.Lookup(u.Model); err != nil {
			return 0, err
		}
	}
	iu := u.internal()
	switch {
	case pr.expr != nil:
		return pr.expr.Eval(m, iu, estimate)
	case estimate:
		return price.Estimate(m, iu)
	}
	return price.Cost(m, iu)
}

// checkPrices compiles the prices section; nil without one.
func checkPrices(pc *config.PricesConfig, rep reporter) *price.Table {
	if pc == nil {
		return nil
	}
	t := &price.Table{Currency: pc.Currency, Models: make(map[string]price.Model, len(pc.Models))}
	if !currencyRE.MatchString(pc.Currency) {
		rep.addAt("prices.currency", fmt.Sprintf("prices needs a currency of 3 upper-case letters such as USD or EUR, got %s", quote(pc.Currency)))
	}
	model := func(path string, mp config.ModelPrice) price.Model {
		var m price.Model
		for _, f := range []struct {
			name, v string
			dst     *int64
		}{{"input", mp.Input, &m.Input}, {"cached_input", mp.CachedInput, &m.CachedInput}, {"output", mp.Output, &m.Output}, {"reasoning", mp.Reasoning, &m.Reasoning}, {"cache_write", mp.CacheWrite, &m.CacheWrite}} {
			if f.v == "" {
				continue
			}
			n, err := price.ParsePerMillion(f.v)
			if err != nil {
				rep.addAt(path+"."+f.name, err.Error())
				continue
			}
			*f.dst = n
		}
		if mp.Input == "" || mp.Output == "" {
			rep.addAt(path, "a model's prices need input and output (per million tokens)")
		}
		if mp.CachedInput == "" {
			m.CachedInput = m.Input
		}
		if mp.Reasoning == "" {
			m.Reasoning = m.Output
		}
		if mp.CacheWrite == "" {
			m.CacheWrite = m.Input
		}
		return m
	}
	for _, mp := range pc.Models {
		t.Models[mp.Model] = model("prices.models."+mp.Model, mp)
	}
	if pc.Unknown != nil {
		m := model("prices.unknown", *pc.Unknown)
		t.Unknown = &m
	}
	return t
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// budgetRE is a budget: an amount, a currency, a period.
var budgetRE = regexp.MustCompile(`^\s*([0-9]*\.?[0-9]*)\s*([A-Za-z]{3})\s*/\s*(\S+)\s*$`)

// checkBudget reads a rule's budget and cost_expr. A budget becomes the
// rule's limit, in micro-units of the currency; rc is the copy of the
// rule the limit checks read.
func (r *rule) checkBudget(rc *config.RuleConfig, rp string, c *compiled, rep reporter) bool {
	if rc.Budget == "" && rc.CostExpr == "" {
		return true
	}
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
	pr := &pricer{table: c.prices}
	if rc.CostExpr != "" {
		x, err := price.Compile(rc.CostExpr)
		if err != nil {
			bad(rp+".cost_expr", fmt.Sprintf("cost_expr %s: %v", quote(rc.CostExpr), err))
		}
		pr.expr = x
	}
	if rc.Budget == "" {
		if c.prices == nil && rc.CostExpr != "" && usesPrices(rc.CostExpr) {
			bad(rp+".cost_expr", "cost_expr uses prices, but weir.yaml has no prices section")
		}
		if rc.Cost != "" || rc.Count != nil {
			bad(rp+".cost_expr", "cost_expr and cost or count are exclusive: cost_expr is the rule's cost")
		}
		r.price = pr
		return ok
	}
	m := budgetRE.FindStringSubmatch(rc.Budget)
	var amount int64
	if m != nil {
		var err error
		if amount, err = price.ParseAmount(m[1]); err != nil || amount == 0 {
			m = nil
		}
	}
	if m == nil {
		rc.Limit = "1/h" // reported here: no "needs a limit" as well
		bad(rp+".budget", fmt.Sprintf("budget %s is not an amount, a currency and a period, such as 10 USD/month or 25 EUR/day", quote(rc.Budget)))
		return false
	}
	switch {
	case c.prices == nil:
		bad(rp+".budget", "a budget prices usage by the prices section, which weir.yaml lacks")
	case currencyRE.MatchString(c.prices.Currency) && strings.ToUpper(m[2]) != c.prices.Currency:
		bad(rp+".budget", fmt.Sprintf("budget %s is in %s, but prices are in %s", quote(rc.Budget), strings.ToUpper(m[2]), c.prices.Currency))
	}
	if _, err := weir.ParseLimit("1/" + m[3]); err != nil {
		bad(rp+".budget", fmt.Sprintf("budget %s: period %s: %s", quote(rc.Budget), quote(m[3]), limitMessage(err)))
	}
	for _, f := range []struct {
		set  bool
		name string
	}{{rc.Limit != "", "limit"}, {rc.Tiers != nil, "tiers"}, {rc.Cost != "", "cost"}, {rc.Count != nil, "count"}} {
		if f.set {
			bad(rp+"."+f.name, f.name+" and budget are exclusive: a budget's limit is its amount, its cost the request's price")
		}
	}
	if !ok {
		rc.Limit = "1/h"
		return false
	}
	rc.Limit = strconv.FormatInt(amount, 10) + "/" + m[3]
	if rc.Algorithm == "" {
		rc.Algorithm = string(weir.FixedWindow)
	}
	pr.currency = c.prices.Currency
	r.price = pr
	return true
}

// usesPrices reports whether a cost expression names a price variable.
func usesPrices(src string) bool { return strings.Contains(src, "_price") }

// priceOf prices the usage estimate in ctx (WithUsage) for a budget or
// cost_expr rule under its tier limit l. A request without one, for a
// model the table refuses, or costing more than the limit can ever
// admit, is a bad cost (400).
func (r *rule) priceOf(ctx context.Context, l weir.Limit) (int64, error) {
	u, ok := ctx.Value(usageKey{}).(Usage)
	if !ok {
		return 0, fmt.Errorf("%w: rule %q prices usage, and the request carries no usage estimate (policy.WithUsage)", ErrBadCost, r.name)
	}
	n, err := r.price.estimate(u)
	if err != nil {
		return 0, fmt.Errorf("%w: rule %q: %w", ErrBadCost, r.name, err)
	}
	if p, _ := l.Compile(); n > p.MaxCost() {
		return 0, fmt.Errorf("%w: rule %q: the request's estimate, %d micro-units, is more than the budget can ever admit (%d)", ErrBadCost, r.name, n, p.MaxCost())
	}
	return n, nil
}

// moneyLimit renders a budget's limit l, counted in micro-units, as an
// amount of currency per period: "10 USD/month", "0.05 USD/d".
func moneyLimit(l weir.Limit, currency string) string {
	_, per, _ := strings.Cut(weir.Limit{Rate: l.Rate, Period: l.Period, Calendar: l.Calendar}.String(), "/")
	return price.Format(l.Rate) + " " + currency + "/" + per
}

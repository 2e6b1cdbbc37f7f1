package replay

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
)

// Suggestion is the answer of `weir replay --suggest RULE --target T`.
type Suggestion struct {
	Rule string `json:"rule"`
	// Target is the share of identities that may be limited (0.01 for 1%).
	Target float64 `json:"target"`
	// Limit is the smallest limit found, in the rule's syntax ("120/m"),
	// on the rule's algorithm, period, burst and identity.
	Limit string `json:"limit"`
	// Rate is Limit's count per period.
	Rate int64 `json:"rate"`
	// Identities is how many identities the rule counted;
	// LimitedIdentities how many Limit would have limited.
	Identities        int64 `json:"identities"`
	LimitedIdentities int64 `json:"limited_identities"`
	// Passes is how many times the log was read.
	Passes int `json:"passes"`
}

// maxSuggestRate is the largest rate --suggest tries: 2^30 per period.
const maxSuggestRate = 1 << 30

// Opener opens the inputs afresh for another pass; close releases them.
type Opener func() (ins []Input, close func(), err error)

// Suggest finds the smallest rate, on the named rule's algorithm, period,
// burst and identity, under which at most target of the rule's identities
// would have been limited. The rule is judged on its own, as a shadow
// rule (the other rules, all or nothing, play no part); the allow and deny
// lists still apply. Each pass reads the log once and tries up to 31 rates
// side by side: powers of two first, then evenly spaced rates between the
// largest rate that failed and the smallest that passed, until they are
// adjacent.
func Suggest(ctx context.Context, open Opener, cfg *config.Config, rule string, target float64, o Options) (*Suggestion, error) {
	var rc *config.RuleConfig
	for i := range cfg.Rules {
		if cfg.Rules[i].Name == rule {
			rc = &cfg.Rules[i]
		}
	}
	switch {
	case rc == nil:
		return nil, fmt.Errorf("--suggest %q: the config has no such rule", rule)
	case rc.Tiers != nil:
		return nil, fmt.Errorf("--suggest %q: the rule has tiers; --suggest works on a rule with one limit", rule)
	case !(target >= 0 && target < 1):
		return nil, fmt.Errorf("--target %v: want a share from 0%% up to (not including) 100%%", target)
	}
	fields := strings.Fields(rc.Limit)
	if len(fields) == 0 {
		return nil, fmt.Errorf("--suggest %q: the rule has no limit", rule)
	}
	_, period, ok := strings.Cut(fields[0], "/")
	if !ok {
		return nil, fmt.Errorf("--suggest %q: limit %q has no period", rule, rc.Limit)
	}
	rest := strings.Join(fields[1:], " ")
	limitOf := func(n int64) string {
		s := strconv.FormatInt(n, 10) + "/" + period
		if rest != "" {
			s += " " + rest
		}
		return s
	}
	// The largest rate the algorithm takes (sliding_log keeps an entry
	// per event, so it has a maximum).
	top := int64(maxSuggestRate)
	for top > 1 && !validRate(rc, limitOf(top)) {
		top /= 2
	}
	if !validRate(rc, limitOf(1)) {
		return nil, fmt.Errorf("--suggest %q: limit %q: %v", rule, limitOf(1), rateErr(rc, limitOf(1)))
	}
	s := &Suggestion{Rule: rule, Target: target}
	var cands []int64
	for n := int64(1); n <= top; n *= 2 {
		cands = append(cands, n)
	}
	lo, hi := int64(0), int64(-1) // lo fails (0 always), hi passes
	var hiIDs, hiLimited int64
	for len(cands) > 0 {
		c := *cfg
		c.Rules = nil
		for i, n := range cands {
			r := *rc
			r.Name, r.Limit, r.Shadow = "c"+strconv.Itoa(i), limitOf(n), true
			c.Rules = append(c.Rules, r)
		}
		ins, closeFn, err := open()
		if err != nil {
			return nil, err
		}
		reps, err := Run(ctx, ins, []*config.Config{&c}, o)
		closeFn()
		if err != nil {
			return nil, err
		}
		s.Passes++
		rep := reps[0]
		if len(rep.NotEvaluated) > 0 && len(rep.Rules) == 0 {
			return nil, fmt.Errorf("--suggest %q: the log cannot evaluate the rule: %s", rule, rep.NotEvaluated[0].Reason)
		}
		for i, n := range cands {
			rr := rep.Rules[i]
			if rr.Identities == 0 {
				return nil, fmt.Errorf("--suggest %q: the rule matched no request of the log", rule)
			}
			if float64(rr.LimitedIdentities) <= target*float64(rr.Identities) {
				if hi < 0 || n < hi {
					hi, hiIDs, hiLimited = n, rr.Identities, rr.LimitedIdentities
				}
			} else if n > lo {
				lo = n
			}
		}
		if hi < 0 {
			return nil, fmt.Errorf("--suggest %q: even %s, the largest rate tried, limits more than the target share", rule, limitOf(top))
		}
		cands = between(lo, hi, 31)
	}
	s.Rate, s.Limit, s.Identities, s.LimitedIdentities = hi, limitOf(hi), hiIDs, hiLimited
	return s, nil
}

// between returns up to k rates evenly spaced strictly between lo and hi.
func between(lo, hi int64, k int64) []int64 {
	gap := hi - lo - 1
	if gap <= 0 {
		return nil
	}
	if gap <= k {
		out := make([]int64, 0, gap)
		for n := lo + 1; n < hi; n++ {
			out = append(out, n)
		}
		return out
	}
	out := make([]int64, 0, k)
	for i := int64(1); i <= k; i++ {
		n := lo + i*(hi-lo)/(k+1)
		if n > lo && n < hi && (len(out) == 0 || out[len(out)-1] != n) {
			out = append(out, n)
		}
	}
	return out
}

// rateErr returns why limit is not a valid limit for the rule's algorithm.
func rateErr(rc *config.RuleConfig, limit string) error {
	l, err := weir.ParseLimit(limit)
	if err != nil {
		return err
	}
	l.Algorithm = weir.Algorithm(rc.Algorithm)
	if l.Algorithm == "" {
		l.Algorithm = weir.GCRA
	}
	if rc.Burst != 0 {
		l.Burst = rc.Burst
	}
	l.Block, l.MaxDelay, l.DelayAfter, l.Buckets = rc.Block, rc.MaxDelay, rc.DelayAfter, max(l.Buckets, rc.Buckets)
	return l.Validate()
}

func validRate(rc *config.RuleConfig, limit string) bool { return rateErr(rc, limit) == nil }

package replay

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Comparison is what `weir replay --compare` prints with --json: both
// reports, and per rule what changes and for whom.
type Comparison struct {
	Base    *Report      `json:"base"`
	Other   *Report      `json:"other"`
	Changes []RuleChange `json:"changes"`
}

// RuleChange is one rule's difference between two configs. A rule in one
// config only has zero counts on the other side.
type RuleChange struct {
	Rule string `json:"rule"`
	// Limited and LimitedIdentities are [base, other]; Limited counts
	// enforced and shadow limits together.
	Limited           [2]int64 `json:"limited"`
	LimitedIdentities [2]int64 `json:"limited_identities"`
	// Shadow is [base, other]: whether the rule only reported (shadow) in
	// each; its limits then were shadow limits.
	Shadow [2]bool `json:"shadow"`
	// NewlyLimited lists identities the other config limits more (most
	// extra limited requests first), NoLongerLimited those it limits less.
	NewlyLimited    []Top `json:"newly_limited"`
	NoLongerLimited []Top `json:"no_longer_limited"`
}

// Compare diffs two reports of the same lines.
func Compare(base, other *Report) *Comparison {
	c := &Comparison{Base: base, Other: other, Changes: []RuleChange{}}
	find := func(r *Report, name string) RuleReport {
		for _, rr := range r.Rules {
			if rr.Name == name {
				return rr
			}
		}
		return RuleReport{Name: name}
	}
	var names []string
	seen := map[string]bool{}
	for _, r := range []*Report{base, other} {
		for _, rr := range r.Rules {
			if !seen[rr.Name] {
				seen[rr.Name] = true
				names = append(names, rr.Name)
			}
		}
	}
	for _, name := range names {
		a, b := find(base, name), find(other, name)
		ch := RuleChange{
			Rule:              name,
			Limited:           [2]int64{a.Limited + a.ShadowLimited, b.Limited + b.ShadowLimited},
			LimitedIdentities: [2]int64{a.LimitedIdentities, b.LimitedIdentities},
			Shadow:            [2]bool{base.shadow[name], other.shadow[name]},
			NewlyLimited:      []Top{}, NoLongerLimited: []Top{},
		}
		am, bm := base.limited[name], other.limited[name]
		for id, n := range bm {
			if d := n - am[id]; d > 0 {
				ch.NewlyLimited = append(ch.NewlyLimited, Top{Identity: id, Limited: d})
			}
		}
		for id, n := range am {
			if d := n - bm[id]; d > 0 {
				ch.NoLongerLimited = append(ch.NoLongerLimited, Top{Identity: id, Limited: d})
			}
		}
		sortTop(ch.NewlyLimited)
		sortTop(ch.NoLongerLimited)
		ch.NewlyLimited = ch.NewlyLimited[:min(len(ch.NewlyLimited), maxTop)]
		ch.NoLongerLimited = ch.NoLongerLimited[:min(len(ch.NoLongerLimited), maxTop)]
		c.Changes = append(c.Changes, ch)
	}
	return c
}

// WriteCompareText writes the terminal form of a comparison.
func WriteCompareText(w io.Writer, c *Comparison, baseName, otherName string) {
	fmt.Fprintf(w, "%s (%s), %s to %s: %s against %s\n\n", plural(c.Base.Lines, "line"), clean(c.Base.Format), clean(orDash(c.Base.From)), clean(orDash(c.Base.To)), clean(otherName), clean(baseName))
	for _, r := range []struct {
		name string
		rep  *Report
	}{{baseName, c.Base}, {otherName, c.Other}} {
		for _, n := range r.rep.NotEvaluated {
			fmt.Fprintf(w, "NOT EVALUATED in %s: %s: %s\n", clean(r.name), clean(n.Rule), clean(n.Reason))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rule\tlimited\t→\tchange\tlimited ids\t→\t")
	for _, ch := range c.Changes {
		name := clean(ch.Rule)
		switch ch.Shadow {
		case [2]bool{true, false}:
			name += " (shadow → enforced)"
		case [2]bool{false, true}:
			name += " (enforced → shadow)"
		case [2]bool{true, true}:
			name += " (shadow)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%+d\t%s\t%s\t\n", name, num64(ch.Limited[0]), num64(ch.Limited[1]), ch.Limited[1]-ch.Limited[0],
			num64(ch.LimitedIdentities[0]), num64(ch.LimitedIdentities[1]))
	}
	tw.Flush()
	for _, ch := range c.Changes {
		if len(ch.NewlyLimited) == 0 && len(ch.NoLongerLimited) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", clean(ch.Rule))
		for _, t := range ch.NewlyLimited {
			fmt.Fprintf(w, "  + %8s more limited  %s\n", num64(t.Limited), clean(t.Identity))
		}
		for _, t := range ch.NoLongerLimited {
			fmt.Fprintf(w, "  - %8s fewer limited %s\n", num64(t.Limited), clean(t.Identity))
		}
	}
}

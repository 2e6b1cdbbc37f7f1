package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
)

// RuleInfo describes a rule for GET /v1/rules and the dashboard.
type RuleInfo struct {
	Name      string    `json:"name"`
	Match     MatchInfo `json:"match"`
	Identity  []string  `json:"identity"`
	OnMissing string    `json:"on_missing"`
	// Limit, Algorithm and Block are the default tier's.
	Limit     string `json:"limit"`
	Algorithm string `json:"algorithm"`
	Block     string `json:"block,omitempty"`
	Shadow    bool   `json:"shadow"`
	// NearLimit is the rule's near_limit share (0.8 for 80%), 0 when off.
	NearLimit float64 `json:"near_limit"`
	OnError   string  `json:"on_error"`
	// LocalBudget is the rule's local_budget: units an instance takes
	// from the store at once and spends locally; 0 for none. Its JSON
	// name is still "lease".
	LocalBudget int64      `json:"lease,omitempty"`
	TierBy      string     `json:"tier_by,omitempty"`
	Tiers       []TierInfo `json:"tiers,omitempty"`
	// Blocks lists an escalating penalty's boxes (block: [1m, 10m, 1h]),
	// ForgetAfter its history; Timezone and ResetAt place a calendar
	// limit's windows; Warmup is a bucket's cold start. All are the
	// default tier's, empty when unset.
	Blocks      []string `json:"blocks,omitempty"`
	ForgetAfter string   `json:"forget_after,omitempty"`
	Timezone    string   `json:"timezone,omitempty"`
	ResetAt     string   `json:"reset_at,omitempty"`
	Warmup      string   `json:"warmup,omitempty"`
	// Cost is the rule's cost: setting, empty for 1; CountStatus its
	// count.status list (cost.go).
	Cost        string `json:"cost,omitempty"`
	CountStatus []int  `json:"count_status,omitempty"`
	// Currency is a budget rule's currency (prices.currency), whose
	// Limit is then an amount per period ("10 USD/month") and whose
	// counts, in the store and in /v1/usage, are micro-units of it.
	Currency string `json:"currency,omitempty"`

	path string
}

// setExtras fills the RuleInfo fields of the penalty-box, calendar and
// warm-up options from l.
func (info *RuleInfo) setExtras(l weir.Limit) {
	if l.ForgetAfter > 0 {
		info.Blocks = append(info.Blocks, l.Block.String())
		for _, b := range l.Escalate {
			if b == 0 {
				break
			}
			info.Blocks = append(info.Blocks, b.String())
		}
		info.ForgetAfter = l.ForgetAfter.String()
	}
	if l.Calendar != 0 {
		info.Timezone = l.Timezone
		if info.Timezone == "" {
			info.Timezone = "UTC"
		}
		info.ResetAt = fmt.Sprintf("%02d:%02d:%02d", int(l.ResetAt.Hours()), int(l.ResetAt.Minutes())%60, int(l.ResetAt.Seconds())%60)
	}
	info.Warmup = durString(l.Warmup)
}

// MatchInfo is a rule's match section.
type MatchInfo struct {
	Methods []string `json:"methods,omitempty"`
	Path    string   `json:"path,omitempty"`
	Host    string   `json:"host,omitempty"`
}

// TierInfo describes one tier of a rule.
type TierInfo struct {
	Name      string `json:"name"`
	Limit     string `json:"limit"`
	Algorithm string `json:"algorithm"`
	Block     string `json:"block,omitempty"`
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func ruleInfo(rc *config.RuleConfig, r *rule, path string) RuleInfo {
	info := RuleInfo{
		Name:        r.name,
		Match:       MatchInfo{Path: rc.Match.Path, Host: rc.Match.Host},
		OnMissing:   r.onMissing,
		Shadow:      r.shadow,
		NearLimit:   r.nearLimit,
		OnError:     r.onError,
		LocalBudget: r.lease,
		path:        path,
	}
	for _, m := range rc.Match.Methods {
		info.Match.Methods = append(info.Match.Methods, strings.ToUpper(strings.TrimSpace(m)))
	}
	for _, id := range r.ids {
		info.Identity = append(info.Identity, id.spec)
	}
	d := r.tiers[0].limit
	info.Limit, info.Algorithm, info.Block = d.String(), string(d.Algorithm), durString(d.Block)
	info.setExtras(d)
	if r.price != nil && r.price.currency != "" {
		info.Currency = r.price.currency
		info.Limit = moneyLimit(d, info.Currency)
	}
	if r.cost != nil {
		info.Cost = r.cost.spec
	}
	info.CountStatus = r.count
	if r.tierBy != nil {
		info.TierBy = r.tierBy.spec
		for _, t := range r.tiers {
			info.Tiers = append(info.Tiers, TierInfo{Name: t.name, Limit: t.limit.String(), Algorithm: string(t.limit.Algorithm), Block: durString(t.limit.Block)})
		}
	}
	return info
}

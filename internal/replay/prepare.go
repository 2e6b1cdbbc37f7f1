package replay

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/policy/config"
)

// NotEvaluated is a rule (or an allow or deny entry) that the replay left
// out because the log does not record what it needs.
type NotEvaluated struct {
	// Rule is the rule's name, or "allow_values[i]" / "deny_values[i]".
	Rule string `json:"rule"`
	// Reason says what the log lacks.
	Reason string `json:"reason"`
}

// prepare returns the config the replay runs: cfg on the memory store,
// without the rules and list entries the log cannot evaluate, which it
// reports. It never changes cfg.
func prepare(cfg *config.Config, f *recorded) (*config.Config, []NotEvaluated, []string) {
	out := *cfg
	out.Store = config.StoreConfig{Type: config.StoreMemory, MaxKeys: cfg.Store.MaxKeys, OnError: cfg.Store.OnError}
	out.Rules = nil
	var skipped []NotEvaluated
	var notes []string
	for i := range cfg.Rules {
		rc := &cfg.Rules[i]
		if why := ruleNeeds(rc, f); why != "" {
			skipped = append(skipped, NotEvaluated{Rule: rc.Name, Reason: why})
			continue
		}
		r := *rc
		if r.LocalBudget > 0 {
			// One simulated instance: a local budget would only hold units back
			// at each window's end, which the fleet would not.
			notes = append(notes, fmt.Sprintf("rule %s: local_budget %d is not replayed; decisions are made as without a local budget (what a fleet admits at most)", r.Name, r.LocalBudget))
			r.LocalBudget = 0
		}
		if r.Cost != "" {
			notes = append(notes, fmt.Sprintf("rule %s: cost %s is charged at its estimate; the real cost a handler settles with httplimit.Charge is not in the log", r.Name, r.Cost))
		}
		if r.Count != nil {
			notes = append(notes, fmt.Sprintf("rule %s: count counts the lines whose logged status it lists; a line without a status counts nothing", r.Name))
		}
		out.Rules = append(out.Rules, r)
	}
	lists := func(name string, vl []config.ValueList) []config.ValueList {
		var keep []config.ValueList
		for i, v := range vl {
			if why := identityNeeds(v.Identity, f); why != "" {
				skipped = append(skipped, NotEvaluated{Rule: fmt.Sprintf("%s[%d]", name, i), Reason: why})
				continue
			}
			keep = append(keep, v)
		}
		return keep
	}
	out.AllowValues = lists("allow_values", cfg.AllowValues)
	out.DenyValues = lists("deny_values", cfg.DenyValues)
	if f.ipNote != "" {
		notes = append(notes, f.ipNote)
	}
	if len(cfg.TrustedProxies) > 0 {
		h := cfg.ClientIPHeader
		if h == "" || strings.EqualFold(h, clientip.Auto) {
			if !f.header("X-Forwarded-For") || !f.header("X-Real-Ip") {
				notes = append(notes, "trusted_proxies is set and the log lacks X-Forwarded-For or X-Real-IP: a request from a trusted proxy is counted by what the log records of them")
			}
		} else if !f.header(http.CanonicalHeaderKey(h)) {
			notes = append(notes, fmt.Sprintf("trusted_proxies is set and the log does not record %s: a request from a trusted proxy is counted by the proxy's address", h))
		}
	}
	return &out, skipped, notes
}

// ruleNeeds returns why the log cannot evaluate the rule, or "".
func ruleNeeds(rc *config.RuleConfig, f *recorded) string {
	switch {
	case rc.Match.Host != "" && !f.host:
		return "match.host: the log does not record the request's Host"
	case len(rc.Match.Methods) > 0 && !f.method:
		return "match.methods: the log does not record the method"
	case rc.Match.Path != "" && !f.uri:
		return "match.path: the log does not record the path"
	}
	ids := rc.Identity
	if len(ids) == 0 {
		ids = []string{"ip"}
	}
	for _, id := range ids {
		if why := identityNeeds(id, f); why != "" {
			return "identity " + why
		}
	}
	if rc.OnMissing == config.OnMissingUseIP && !f.ip {
		return "on_missing use_ip: the log does not record the client address"
	}
	conc := rc.Algorithm == algorithm.NameConcurrency
	if rc.Tiers != nil {
		if why := identityNeeds(rc.Tiers.By, f); why != "" {
			return "tiers.by " + why
		}
		for _, t := range rc.Tiers.Tiers {
			conc = conc || t.Algorithm == algorithm.NameConcurrency
		}
	}
	if conc {
		return "algorithm concurrency: a slot is held for as long as the request runs, which replay does not model"
	}
	if kind, arg, _ := strings.Cut(rc.Cost, ":"); kind == "header" && !f.header(http.CanonicalHeaderKey(arg)) {
		return "cost " + rc.Cost + ": the log does not record the header " + arg
	} else if kind == "query" && !f.uri {
		return "cost " + rc.Cost + ": the log does not record the request's path and query"
	}
	return ""
}

// identityNeeds returns why the log lacks an identity spec's value, or "".
func identityNeeds(spec string, f *recorded) string {
	kind, arg, _ := strings.Cut(spec, ":")
	switch {
	case kind == "ip" || strings.HasPrefix(kind, "ip/"):
		if !f.ip {
			return spec + ": the log does not record the client address"
		}
	case kind == "header":
		if !f.header(http.CanonicalHeaderKey(arg)) {
			return spec + ": the log does not record the header " + arg
		}
	case kind == "cookie":
		if !f.header("Cookie") {
			return spec + ": the log does not record cookies"
		}
	case kind == "query", kind == "route":
		if !f.uri {
			return spec + ": the log does not record the request's path and query"
		}
	case kind == "method":
		if !f.method {
			return spec + ": the log does not record the method"
		}
	}
	return ""
}

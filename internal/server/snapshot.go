package server

import (
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/policy"
)

// sparkLen is how many seconds a rule's sparkline covers.
const sparkLen = 60

// Snapshot is GET /v1/dashboard/snapshot: everything the dashboard draws,
// in one document. It is the contract with package dashboard.
type Snapshot struct {
	NowMS        int64            `json:"now_ms"`
	Instance     SnapshotInstance `json:"instance"`
	AdminEnabled bool             `json:"admin_enabled"`
	// Identities is "full" when the request carried the admin token, and
	// "redacted" otherwise: Top and Blocked then show every identity as a
	// tag ("#" and 16 hex digits) that stays the same within an instance
	// but reveals nothing of the identity.
	Identities string                `json:"identities"`
	Store      SnapshotStore         `json:"store"`
	Series     SnapshotSeries        `json:"series"`
	Instances  []FleetInstance       `json:"instances"`
	Rules      []SnapshotRule        `json:"rules"`
	Top        map[string][]TopEntry `json:"top"`
	Blocked    []BlockedEntry        `json:"blocked"`
	// Protect is the protect rules in force, the system section first.
	Protect []SnapshotProtect `json:"protect"`
}

// SnapshotInstance names the instance that answered.
type SnapshotInstance struct {
	ID      string `json:"id"`
	Version string `json:"version"`
}

// SnapshotStore is the store's health.
type SnapshotStore struct {
	Type     string `json:"type"`     // memory | redis
	Topology string `json:"topology"` // memory | standalone | sentinel | cluster
	// Nodes lists the Redis nodes' addresses: empty without the admin
	// token.
	Nodes   []string `json:"nodes"`
	Healthy bool     `json:"healthy"`
	Breaker string   `json:"breaker"` // closed | open | half_open
	// Store latency quantiles over the last minute.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	ErrorsTotal  uint64  `json:"errors_total"`
	// Fallback is the on_error policy deciding while the store fails
	// (allow, deny or local), "" while it answers.
	Fallback string `json:"fallback"`
	// FallbackSinceMS is when Fallback started deciding (epoch ms), 0
	// while the store answers.
	FallbackSinceMS int64 `json:"fallback_since_ms"`
	// FallbackDecisionsTotal counts the decisions this instance's on_error
	// fallback made since it started (weir_fallback_decisions_total summed).
	FallbackDecisionsTotal uint64 `json:"fallback_decisions_total"`
	// Instances is the instance count on_error: local and leases divide
	// by (instances, or the fleet's live count under instances: auto).
	Instances int `json:"instances"`
	// Leases sums this instance's local-budget units since it started.
	Leases SnapshotLeases `json:"leases"`
	// DenyCache is the deny cache in front of a Redis store; absent
	// without one.
	DenyCache *SnapshotDenyCache `json:"deny_cache,omitempty"`
}

// SnapshotLeases is this instance's local budgets (rules with local_budget: N):
// units debited in the store, admitted from the budgets and lapsed unspent,
// the store calls that took them, and the keys held now.
type SnapshotLeases struct {
	Taken  int64 `json:"taken"`
	Spent  int64 `json:"spent"`
	Lapsed int64 `json:"lapsed"`
	Calls  int64 `json:"calls"`
	Keys   int   `json:"keys"`
}

// SnapshotSeries holds per-second decision counts, oldest first: the
// fleet's total and each rule's.
type SnapshotSeries struct {
	IntervalMS int64                    `json:"interval_ms"`
	StartMS    int64                    `json:"start_ms"`
	Total      SeriesCounts             `json:"total"`
	Rules      map[string]*SeriesCounts `json:"rules"`
}

// SeriesCounts is one series of decisions per second by outcome.
// Decisions the on_error fallback made while the store failed count in
// Allowed, Limited or ShadowLimited by what it decided, and in Fallback.
type SeriesCounts struct {
	Allowed       []int64 `json:"allowed"`
	Limited       []int64 `json:"limited"`
	ShadowLimited []int64 `json:"shadow_limited"`
	Fallback      []int64 `json:"fallback"`
}

func newSeriesCounts(n int) *SeriesCounts {
	return &SeriesCounts{Allowed: make([]int64, n), Limited: make([]int64, n), ShadowLimited: make([]int64, n), Fallback: make([]int64, n)}
}

// SnapshotRule is one rule in force with its recent figures.
type SnapshotRule struct {
	Name      string         `json:"name"`
	Match     string         `json:"match"`
	Identity  string         `json:"identity"`
	Limit     string         `json:"limit"`
	Algorithm string         `json:"algorithm"`
	Shadow    bool           `json:"shadow"`
	Block     string         `json:"block"`
	Tiers     []SnapshotTier `json:"tiers"`
	// Lease is the rule's lease: units each instance takes from the
	// store at once and spends locally; 0 for none.
	Lease int64 `json:"lease,omitempty"`
	// Decisions over the series (five minutes), fleet-wide, and the share
	// of them limited, in percent.
	Decisions  int64   `json:"decisions"`
	LimitedPct float64 `json:"limited_pct"`
	// NearLimit counts, over the same series, the admitted decisions that
	// left their key at or past NearLimitRatio of the limit (0.8 for 80%;
	// 0 when near_limit is off). Envoy rules use the global near_limit.
	NearLimit      int64   `json:"near_limit"`
	NearLimitRatio float64 `json:"near_limit_ratio"`
	// Store latency of this instance's decisions over the last minute.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	// Spark is decisions per second over the last minute, oldest first.
	Spark []int64 `json:"spark"`
	// Currency is a budget rule's currency (its limits and costs are
	// micro-units of it); empty for other rules.
	Currency string `json:"currency,omitempty"`
}

// SnapshotTier is one tier of a tiered rule.
type SnapshotTier struct {
	Name      string `json:"name"`
	Limit     string `json:"limit"`
	Algorithm string `json:"algorithm"`
}

// fallbackRecent is how long after a fallback decision the snapshot still
// reports it.
const fallbackRecent = 10 * time.Second

// snapshot assembles the dashboard's document.
func (s *Server) snapshot(r *http.Request) Snapshot {
	now := s.now()
	nowSec := now.Unix()
	from := nowSec - seriesLen // the last complete seconds
	info := s.storeInfo()
	snap := Snapshot{
		NowMS:        now.UnixMilli(),
		Instance:     SnapshotInstance{ID: s.id, Version: s.version},
		AdminEnabled: s.AdminEnabled(),
		Store: SnapshotStore{
			Type: info.Type, Topology: info.Topology, Nodes: info.Nodes,
			Healthy:                s.healthy.Load(),
			Breaker:                s.guard.State().String(),
			ErrorsTotal:            s.metrics.errorsTotal.Load(),
			FallbackDecisionsTotal: s.metrics.fallbackSum.Load(),
			Instances:              s.instances(),
			Leases:                 s.leaseSnapshot(),
		},
	}
	if snap.Store.Nodes == nil {
		snap.Store.Nodes = []string{}
	}
	snap.Store.LatencyP50MS, snap.Store.LatencyP99MS = s.stats.storeLatency(now)
	snap.Store.DenyCache = s.denyCacheSnapshot()
	if f := s.lastFallbk.Load(); f != nil && now.UnixMilli()-f.atMS < fallbackRecent.Milliseconds() {
		snap.Store.Fallback, snap.Store.FallbackSinceMS = f.mode, f.sinceMS
	}

	perRule, instances := s.fleet.fleetWindow(now, from, seriesLen)
	snap.Instances = instances
	p := s.holder.Load()
	snap.Series = s.series(perRule, from, p)

	for _, ri := range p.Rules() {
		snap.Rules = append(snap.Rules, s.ruleFigures(policyRule(ri), perRule[ri.Name], now))
	}
	for _, er := range s.envoy.Config().Rules() {
		sr := envoyRule(er)
		if !er.Unlimited {
			sr.NearLimitRatio = p.NearLimit()
		}
		snap.Rules = append(snap.Rules, s.ruleFigures(sr, perRule[er.Path], now))
	}
	if snap.Rules == nil {
		snap.Rules = []SnapshotRule{}
	}

	snap.Top = s.topView(10)
	blocked, _ := s.blocked.list(r.Context())
	if blocked == nil {
		blocked = []BlockedEntry{}
	}
	snap.Blocked = blocked
	snap.Protect = s.protectSnapshot()
	return snap
}

// series is the dashboard's per-second counts from the fleet's window
// perRule, which starts at the second from: per rule, every rule in force
// (of p and of Envoy) included, and in total.
func (s *Server) series(perRule map[string][]counts, from int64, p *policy.Policy) SnapshotSeries {
	ss := SnapshotSeries{IntervalMS: 1000, StartMS: from * 1000, Rules: map[string]*SeriesCounts{}}
	total := newSeriesCounts(seriesLen)
	for name, w := range perRule {
		sc := newSeriesCounts(seriesLen)
		for i, c := range w {
			sc.Allowed[i], sc.Limited[i], sc.ShadowLimited[i], sc.Fallback[i] = c[outAllowed], c[outLimited], c[outShadowLimited], c[outFallback]
			total.Allowed[i] += c[outAllowed]
			total.Limited[i] += c[outLimited]
			total.ShadowLimited[i] += c[outShadowLimited]
			total.Fallback[i] += c[outFallback]
		}
		ss.Rules[name] = sc
	}
	ss.Total = *total

	// Every rule in force has a series, zeros if it saw no traffic.
	for _, ri := range p.Rules() {
		if ss.Rules[ri.Name] == nil {
			ss.Rules[ri.Name] = newSeriesCounts(seriesLen)
		}
	}
	for _, er := range s.envoy.Config().Rules() {
		if ss.Rules[er.Path] == nil {
			ss.Rules[er.Path] = newSeriesCounts(seriesLen)
		}
	}
	return ss
}

// policyRule describes a policy rule on the dashboard.
func policyRule(ri policy.RuleInfo) SnapshotRule {
	sr := SnapshotRule{
		Name:      ri.Name,
		Match:     matchString(ri.Match),
		Identity:  strings.Join(ri.Identity, ", "),
		Limit:     ri.Limit,
		Algorithm: ri.Algorithm,
		Shadow:    ri.Shadow,
		Block:     shortDuration(ri.Block),
		// NearLimitRatio is the rule's near_limit.
		NearLimitRatio: ri.NearLimit,
		Tiers:          []SnapshotTier{},
		Lease:          ri.LocalBudget,
		Currency:       ri.Currency,
	}
	if sr.Identity == "" {
		sr.Identity = "ip"
	}
	for _, t := range ri.Tiers {
		sr.Tiers = append(sr.Tiers, SnapshotTier{Name: t.Name, Limit: t.Limit, Algorithm: t.Algorithm})
	}
	return sr
}

// envoyRule describes an Envoy descriptor rule on the dashboard.
func envoyRule(er envoyrls.Rule) SnapshotRule {
	sr := SnapshotRule{
		Name:     er.Path,
		Match:    "envoy domain " + er.Domain,
		Identity: "descriptor",
		Shadow:   er.Shadow,
		Tiers:    []SnapshotTier{},
	}
	if er.Unlimited {
		sr.Limit = "unlimited"
	} else {
		sr.Limit, sr.Algorithm = er.Limit.String(), string(er.Limit.Algorithm)
	}
	return sr
}

// ruleFigures fills a rule's decisions, limited share, latency and spark.
func (s *Server) ruleFigures(sr SnapshotRule, w []counts, now time.Time) SnapshotRule {
	var sum counts
	for _, c := range w {
		sum.add(c)
	}
	sr.Decisions = sum.decisions()
	sr.NearLimit = sum[outNearLimit]
	if sr.Decisions > 0 {
		sr.LimitedPct = math.Round(float64(sum[outLimited]+sum[outShadowLimited])/float64(sr.Decisions)*1000) / 10
	}
	sr.LatencyP50MS, sr.LatencyP99MS = s.stats.latency(sr.Name, now)
	sr.Spark = make([]int64, sparkLen)
	if len(w) >= sparkLen {
		for i, c := range w[len(w)-sparkLen:] {
			sr.Spark[i] = c.decisions()
		}
	}
	return sr
}

// handleSnapshot serves GET /v1/dashboard/snapshot: identities and the
// store's node addresses with the admin token; without it, identities
// redacted and no node.
func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	full, ok := s.readAccess(w, r)
	if !ok {
		return
	}
	snap := s.snapshot(r)
	snap.Identities = identitiesFull
	if !full {
		snap.Identities = identitiesRedacted
		snap.Top = s.redact.tops(snap.Top)
		snap.Blocked = s.redact.blocked(snap.Blocked)
		// The Redis nodes' addresses are the admin's to see.
		snap.Store.Nodes = []string{}
	}
	writeJSON(w, http.StatusOK, snap)
}

// matchString renders a rule's match as "POST /api/login".
func matchString(m policy.MatchInfo) string {
	var parts []string
	if len(m.Methods) > 0 {
		parts = append(parts, strings.Join(m.Methods, ","))
	}
	target := m.Host + m.Path
	if target == "" {
		target = "*"
	}
	parts = append(parts, target)
	return strings.Join(parts, " ")
}

// shortDuration renders "15m0s" as "15m" and "1h0m0s" as "1h".
func shortDuration(s string) string {
	d, err := time.ParseDuration(s)
	if err != nil || d == 0 {
		return s
	}
	out := d.String()
	if strings.HasSuffix(out, "m0s") {
		out = strings.TrimSuffix(out, "0s")
	}
	if strings.HasSuffix(out, "h0m") {
		out = strings.TrimSuffix(out, "0m")
	}
	return out
}

// leaseSnapshot reads the lease table's counters.
func (s *Server) leaseSnapshot() SnapshotLeases {
	st := s.leases.Stats()
	return SnapshotLeases{Taken: st.Taken, Spent: st.Spent, Lapsed: st.Lapsed, Calls: st.Calls, Keys: st.Entries}
}

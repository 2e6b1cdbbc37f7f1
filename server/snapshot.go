package server

import (
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/weir-dev/weir/policy"
)

// sparkLen is how many seconds a rule's sparkline covers.
const sparkLen = 60

// Snapshot is GET /v1/dashboard/snapshot: everything the dashboard draws,
// in one document. It is the contract with package dashboard.
type Snapshot struct {
	NowMS        int64                 `json:"now_ms"`
	Instance     SnapshotInstance      `json:"instance"`
	AdminEnabled bool                  `json:"admin_enabled"`
	Store        SnapshotStore         `json:"store"`
	Series       SnapshotSeries        `json:"series"`
	Instances    []FleetInstance       `json:"instances"`
	Rules        []SnapshotRule        `json:"rules"`
	Top          map[string][]TopEntry `json:"top"`
	Blocked      []BlockedEntry        `json:"blocked"`
}

// SnapshotInstance names the instance that answered.
type SnapshotInstance struct {
	ID      string `json:"id"`
	Version string `json:"version"`
}

// SnapshotStore is the store's health.
type SnapshotStore struct {
	Type     string   `json:"type"`     // memory | redis
	Topology string   `json:"topology"` // memory | standalone | sentinel | cluster
	Nodes    []string `json:"nodes"`
	Healthy  bool     `json:"healthy"`
	Breaker  string   `json:"breaker"` // closed | open | half_open
	// Store latency quantiles over the last minute.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	ErrorsTotal  uint64  `json:"errors_total"`
	// Fallback is the on_error policy deciding while the store fails
	// (allow, deny or local), "" while it answers.
	Fallback string `json:"fallback"`
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
type SeriesCounts struct {
	Allowed       []int64 `json:"allowed"`
	Limited       []int64 `json:"limited"`
	ShadowLimited []int64 `json:"shadow_limited"`
}

func newSeriesCounts(n int) *SeriesCounts {
	return &SeriesCounts{Allowed: make([]int64, n), Limited: make([]int64, n), ShadowLimited: make([]int64, n)}
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
	// Decisions over the series (five minutes), fleet-wide, and the share
	// of them limited, in percent.
	Decisions  int64   `json:"decisions"`
	LimitedPct float64 `json:"limited_pct"`
	// Store latency of this instance's decisions over the last minute.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	// Spark is decisions per second over the last minute, oldest first.
	Spark []int64 `json:"spark"`
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
			Healthy:     s.healthy.Load(),
			Breaker:     s.guard.State().String(),
			ErrorsTotal: s.metrics.errorsTotal.Load(),
		},
	}
	if snap.Store.Nodes == nil {
		snap.Store.Nodes = []string{}
	}
	snap.Store.LatencyP50MS, snap.Store.LatencyP99MS = s.stats.storeLatency(now)
	if f := s.lastFallbk.Load(); f != nil && now.UnixMilli()-f.atMS < fallbackRecent.Milliseconds() {
		snap.Store.Fallback = f.mode
	}

	perRule, instances := s.fleet.fleetWindow(now, from, seriesLen)
	snap.Instances = instances
	snap.Series = SnapshotSeries{IntervalMS: 1000, StartMS: from * 1000, Rules: map[string]*SeriesCounts{}}
	total := newSeriesCounts(seriesLen)
	for name, w := range perRule {
		sc := newSeriesCounts(seriesLen)
		for i, c := range w {
			sc.Allowed[i], sc.Limited[i], sc.ShadowLimited[i] = c[outAllowed], c[outLimited], c[outShadowLimited]
			total.Allowed[i] += c[outAllowed]
			total.Limited[i] += c[outLimited]
			total.ShadowLimited[i] += c[outShadowLimited]
		}
		snap.Series.Rules[name] = sc
	}
	snap.Series.Total = *total

	// Every rule in force has a series, zeros if it saw no traffic.
	p := s.holder.Load()
	for _, ri := range p.Rules() {
		if snap.Series.Rules[ri.Name] == nil {
			snap.Series.Rules[ri.Name] = newSeriesCounts(seriesLen)
		}
	}
	for _, er := range s.envoy.Config().Rules() {
		if snap.Series.Rules[er.Path] == nil {
			snap.Series.Rules[er.Path] = newSeriesCounts(seriesLen)
		}
	}

	for _, ri := range p.Rules() {
		sr := SnapshotRule{
			Name:      ri.Name,
			Match:     matchString(ri.Match),
			Identity:  strings.Join(ri.Identity, ", "),
			Limit:     ri.Limit,
			Algorithm: ri.Algorithm,
			Shadow:    ri.Shadow,
			Block:     shortDuration(ri.Block),
			Tiers:     []SnapshotTier{},
		}
		if sr.Identity == "" {
			sr.Identity = "ip"
		}
		for _, t := range ri.Tiers {
			sr.Tiers = append(sr.Tiers, SnapshotTier{Name: t.Name, Limit: t.Limit, Algorithm: t.Algorithm})
		}
		snap.Rules = append(snap.Rules, s.ruleFigures(sr, perRule[ri.Name], now))
	}
	for _, er := range s.envoy.Config().Rules() {
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
	return snap
}

// ruleFigures fills a rule's decisions, limited share, latency and spark.
func (s *Server) ruleFigures(sr SnapshotRule, w []counts, now time.Time) SnapshotRule {
	var sum counts
	for _, c := range w {
		sum.add(c)
	}
	sr.Decisions = sum.decisions()
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

// handleSnapshot serves GET /v1/dashboard/snapshot.
func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.snapshot(r))
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

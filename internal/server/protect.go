package server

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/protect"
)

// protectCollector exports the protect rules of the policy in force, read
// at each scrape. Its labels are rule names from the config (and the
// system section's "system"), priorities and breaker states: all bounded.
type protectCollector struct {
	stats func() []protect.Stats

	limit, inFlight, admitted, shed, circuitOpen, state, transitions *prometheus.Desc
}

func newProtectCollector(stats func() []protect.Stats) *protectCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append([]string{"protect"}, labels...), nil)
	}
	return &protectCollector{
		stats:       stats,
		limit:       d("weir_protect_limit", "Concurrency limit in force per protect rule (the adaptive one as it stands); 0 when the rule has none."),
		inFlight:    d("weir_protect_in_flight", "Requests admitted by the protect rule and not yet done."),
		admitted:    d("weir_protect_admitted_total", "Requests the protect rule admitted, by priority (critical, normal, sheddable).", "priority"),
		shed:        d("weir_protect_shed_total", "Requests the protect rule shed (503 overloaded), by priority; in shadow mode, those it would have shed.", "priority"),
		circuitOpen: d("weir_protect_circuit_open_total", "Requests the protect rule's breaker refused (503 circuit_open); in shadow mode, those it would have refused."),
		state:       d("weir_protect_breaker_state", "State of the protect rule's circuit breaker: 0 closed, 1 half-open, 2 open (rules with a breaker only)."),
		transitions: d("weir_protect_breaker_transitions_total", "Entries of the protect rule's breaker into each state (closed, open, half_open).", "state"),
	}
}

// Describe sends nothing: the rules change with reloads, so the
// collector is unchecked.
func (c *protectCollector) Describe(chan<- *prometheus.Desc) {}

// Collect reads the rules in force.
func (c *protectCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stats() {
		n := s.Name
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(s.Limit), n)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(s.InFlight), n)
		for p := range protect.NumPriorities {
			prio := protect.Priority(p).String()
			ch <- prometheus.MustNewConstMetric(c.admitted, prometheus.CounterValue, float64(s.Admitted[p]), n, prio)
			ch <- prometheus.MustNewConstMetric(c.shed, prometheus.CounterValue, float64(s.Shed[p]), n, prio)
		}
		if !s.Breaker {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.circuitOpen, prometheus.CounterValue, float64(s.CircuitOpen), n)
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, protectBreakerValue(s.State), n)
		for st := range protect.NumStates {
			ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(s.Transitions[st]), n, protect.State(st).String())
		}
	}
}

// protectBreakerValue is a breaker state as weir_circuit_breaker_state
// numbers the store's: 0 closed, 1 half-open, 2 open.
func protectBreakerValue(s protect.State) float64 {
	switch s {
	case protect.HalfOpen:
		return 1
	case protect.Open:
		return 2
	}
	return 0
}

// protectStats reads the protect rules of the policy in force; none before
// a policy is loaded.
func (s *Server) protectStats() []protect.Stats {
	if s.holder == nil {
		return nil
	}
	if p := s.holder.Load(); p != nil {
		return p.ProtectStats()
	}
	return nil
}

// SnapshotProtect is one protect rule on the dashboard.
type SnapshotProtect struct {
	Name     string `json:"name"`
	Adaptive bool   `json:"adaptive"`
	Shadow   bool   `json:"shadow"`
	Limit    int    `json:"limit"` // 0: none
	InFlight int    `json:"in_flight"`
	// BaseRTTMS is the adaptive limit's unloaded latency; 0 until measured.
	BaseRTTMS float64 `json:"base_rtt_ms"`
	// Admitted and Shed count requests by priority since the rule came in
	// force, keyed critical, normal and sheddable.
	Admitted    map[string]uint64 `json:"admitted"`
	Shed        map[string]uint64 `json:"shed"`
	CircuitOpen uint64            `json:"circuit_open"`
	// Breaker is closed, open or half_open; "" for a rule without one.
	Breaker     string `json:"breaker"`
	Transitions uint64 `json:"transitions"`
}

// protectSnapshot is the dashboard's view of the protect rules.
func (s *Server) protectSnapshot() []SnapshotProtect {
	out := []SnapshotProtect{}
	for _, st := range s.protectStats() {
		sp := SnapshotProtect{
			Name: st.Name, Adaptive: st.Adaptive, Shadow: st.Shadow, Limit: st.Limit, InFlight: st.InFlight,
			BaseRTTMS: float64(st.BaseRTT.Microseconds()) / 1000, CircuitOpen: st.CircuitOpen,
			Admitted: map[string]uint64{}, Shed: map[string]uint64{},
		}
		for p := range protect.NumPriorities {
			name := protect.Priority(p).String()
			sp.Admitted[name], sp.Shed[name] = st.Admitted[p], st.Shed[p]
		}
		if st.Breaker {
			sp.Breaker = st.State.String()
			for _, n := range st.Transitions {
				sp.Transitions += n
			}
		}
		out = append(out, sp)
	}
	return out
}

// protectHandler applies the policy's system section and protect rules to
// weir serve's own HTTP API, as policy.Middleware does for an application:
// a protect rule matching /v1/check guards the service itself. Health,
// readiness and metrics are exempt, so that an overloaded instance still
// answers its probes and its scrapes.
func (s *Server) protectHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := s.holder.Load()
		if p == nil || exemptFromProtect(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		a, rej := p.Protect(r)
		if rej != nil {
			protect.WriteRejection(w, rej)
			return
		}
		if a == nil {
			next.ServeHTTP(w, r)
			return
		}
		protect.Track(w, r, next, a.DoneWaited)
	})
}

func exemptFromProtect(path string) bool {
	return path == "/metrics" || path == "/readyz" || strings.HasPrefix(path, "/healthz")
}

// protectUnary applies the policy's system section and protect rules to
// weir serve's gRPC calls (Envoy's ShouldRateLimit), matching a rule's
// path against the call's full method name, such as
// /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit. A refused
// call gets codes.Unavailable, which Envoy treats as the rate-limit
// service failing (its failure_mode_deny decides). The health service is
// exempt. A call that fails with Internal, Unavailable, Unknown or
// DeadlineExceeded counts as a failure for the breakers.
func (s *Server) protectUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	p := s.holder.Load()
	if p == nil || !p.HasProtection() || strings.HasPrefix(info.FullMethod, "/grpc.health.") {
		return handler(ctx, req)
	}
	hr := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: info.FullMethod}, Header: http.Header{}}).WithContext(ctx)
	a, rej := p.Protect(hr)
	if rej != nil {
		return nil, status.Error(codes.Unavailable, rej.Error())
	}
	failed := true
	defer func() { a.Done(failed) }()
	resp, err := handler(ctx, req)
	switch status.Code(err) {
	case codes.Internal, codes.Unavailable, codes.Unknown, codes.DeadlineExceeded:
	default:
		failed = false
	}
	return resp, err
}

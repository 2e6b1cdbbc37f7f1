package server

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weir-dev/weir/internal/buildinfo"
	"github.com/weir-dev/weir/protect"
	"github.com/weir-dev/weir/store/localbudget"
)

// Values of the result label of weir_decisions_total.
const (
	resultAllowed       = "allowed"
	resultLimited       = "limited"
	resultShadowLimited = "shadow_limited"
	resultError         = "error"
	resultDenied        = "denied"
)

// Rule label values for decisions that no rule made.
const (
	ruleAllowList = "(allow list)"
	ruleDenyList  = "(deny list)"
)

// metrics are the service's Prometheus metrics, in a registry of their own:
// nothing is registered globally, so two Servers in one process (tests)
// never collide. Label values are bounded: rule names from the config,
// never identities.
type metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	storeLatency prometheus.Histogram
	fallbacks    *prometheus.CounterVec
	near         *prometheus.CounterVec
	storeErrors  prometheus.Counter
	reloads      *prometheus.CounterVec
	errorsTotal  atomic.Uint64 // storeErrors, readable for the snapshot
	fallbackSum  atomic.Uint64 // fallbacks summed, readable for the snapshot
}

// newMetrics registers the metrics; breaker reports the circuit breaker's
// state as 0 (closed), 1 (half-open) or 2 (open), and protectStats the
// protect rules in force.
func newMetrics(breaker func() float64, protectStats func() []protect.Stats) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_decisions_total",
			Help: "Rate-limit decisions by rule and result (allowed, limited, shadow_limited, denied; error when an Envoy call failed). A decision the on_error fallback made counts by what it decided, and in weir_fallback_decisions_total too.",
		}, []string{"rule", "result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_fallback_decisions_total",
			Help: "Decisions made by the on_error fallback while the store failed, by rule, fallback (allow, deny, local) and result (allowed, limited, shadow_limited).",
		}, []string{"rule", "fallback", "result"}),
		near: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_near_limit_total",
			Help: "Admitted decisions that left their key at or past the rule's near_limit share of its limit (80% by default), by rule; also counted in weir_decisions_total as allowed. Peeks and rejections never count.",
		}, []string{"rule"}),
		storeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_store_latency_seconds",
			Help:    "Latency of store calls made for decisions.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_store_errors_total",
			Help: "Decisions the store failed to make (errors, timeouts, open circuit breaker); decisions never sent to the store and callers that gave up are not counted.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_config_reloads_total",
			Help: "Rule-set reloads by result (success, failure).",
		}, []string{"result"}),
	}
	breakerGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_circuit_breaker_state",
		Help: "State of the circuit breaker in front of the store: 0 closed, 1 half-open, 2 open.",
	}, breaker)
	m.reg.MustRegister(newProtectCollector(protectStats))
	m.reg.MustRegister(m.decisions, m.fallbacks, m.near, m.storeLatency, m.storeErrors, m.reloads, breakerGauge,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Make the reload series exist from the start, at 0.
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m
}

// buildInfo registers weir_build_info, a constant 1 whose labels name the
// running binary: version, its VCS revision and the Go toolchain.
func (m *metrics) buildInfo(version string) {
	in := buildinfo.Read()
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_build_info",
		Help: "A constant 1 labelled with the running binary's version, VCS revision (with -dirty for uncommitted changes) and Go version.",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"revision":  revisionLabel(in),
			"goversion": in.GoVersion,
		},
	}, func() float64 { return 1 }))
}

func revisionLabel(in buildinfo.Info) string {
	if in.Revision == "" {
		return "unknown"
	}
	if in.Modified {
		return in.Revision + "-dirty"
	}
	return in.Revision
}

// leases registers the leased budgets' metrics, read from t when scraped,
// and the instance count in use. The labels are fixed sets.
func (m *metrics) leases(t *localbudget.Table, instances func() int) {
	calls := func(empty bool) func() float64 {
		return func() float64 {
			st := t.Stats()
			if empty {
				return float64(st.Empty)
			}
			return float64(st.Calls - st.Empty)
		}
	}
	units := func(get func(localbudget.Stats) int64) func() float64 {
		return func() float64 { return float64(get(t.Stats())) }
	}
	const callsHelp = "Store calls that asked for a lease (rules with lease: N), by result: granted (units debited) or empty (nothing left; the refusal is remembered until the store's retry time)."
	const unitsHelp = "Leased units by event: taken (debited in the store), spent (admitted from a lease), lapsed (their window or bucket ended unspent, or a reset dropped them)."
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weir_lease_calls_total", Help: callsHelp, ConstLabels: prometheus.Labels{"result": "granted"}}, calls(false)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weir_lease_calls_total", Help: callsHelp, ConstLabels: prometheus.Labels{"result": "empty"}}, calls(true)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weir_lease_units_total", Help: unitsHelp, ConstLabels: prometheus.Labels{"event": "taken"}}, units(func(s localbudget.Stats) int64 { return s.Taken })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weir_lease_units_total", Help: unitsHelp, ConstLabels: prometheus.Labels{"event": "spent"}}, units(func(s localbudget.Stats) int64 { return s.Spent })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "weir_lease_units_total", Help: unitsHelp, ConstLabels: prometheus.Labels{"event": "lapsed"}}, units(func(s localbudget.Stats) int64 { return s.Lapsed })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weir_lease_keys", Help: "Keys this instance holds a lease or a remembered refusal for (at most 10,000; beyond, keys are decided without a lease)."}, func() float64 { return float64(t.Stats().Entries) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weir_instances", Help: "The instance count on_error: local and leases divide by: instances, or with instances: auto the fleet registry's live count, at least instances_floor."}, func() float64 { return float64(instances()) }),
	)
}

// decision counts one decision.
func (m *metrics) decision(rule, result string) {
	m.decisions.WithLabelValues(rule, result).Inc()
}

// fallbackDecision counts one decision that the on_error fallback mode
// (allow, deny or local) made, also counted by decision.
func (m *metrics) fallbackDecision(rule, mode, result string) {
	m.fallbacks.WithLabelValues(rule, mode, result).Inc()
	m.fallbackSum.Add(1)
}

// nearLimit counts one admitted decision near rule's limit.
func (m *metrics) nearLimit(rule string) {
	m.near.WithLabelValues(rule).Inc()
}

// store records one store call.
func (m *metrics) store(lat time.Duration, failed bool) {
	if lat >= 0 {
		m.storeLatency.Observe(lat.Seconds())
	}
	if failed {
		m.storeErrors.Inc()
		m.errorsTotal.Add(1)
	}
}

// reload counts one rule-set reload.
func (m *metrics) reload(ok bool) {
	if ok {
		m.reloads.WithLabelValues("success").Inc()
	} else {
		m.reloads.WithLabelValues("failure").Inc()
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/store/denycache"
)

// flushDenyCache drops every cached denial here and, through the bus, on
// every instance: a rule change may make limits share a key's state.
func (s *Server) flushDenyCache() {
	if s.deny == nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(s.bgCtx, 2*time.Second)
		defer cancel()
		if err := s.deny.Flush(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("weir: publishing a deny-cache flush after a rule change failed; other instances flush on their own reload", "err", err)
		}
	}()
}

// denyCacheSnapshot is the deny cache's part of the dashboard's document.
func (s *Server) denyCacheSnapshot() *SnapshotDenyCache {
	if s.deny == nil {
		return nil
	}
	st := s.deny.Stats()
	out := &SnapshotDenyCache{Live: st.Live, Entries: st.Entries, HitsTotal: st.Hits, MissesTotal: st.Misses}
	for _, n := range st.Invalidations {
		out.InvalidationsTotal += n
	}
	return out
}

// SnapshotDenyCache is the deny cache's state on the dashboard: the hit
// ratio is HitsTotal / (HitsTotal + MissesTotal).
type SnapshotDenyCache struct {
	Live               bool  `json:"live"` // in use: its invalidation channel is subscribed
	Entries            int   `json:"entries"`
	HitsTotal          int64 `json:"hits_total"`
	MissesTotal        int64 `json:"misses_total"`
	InvalidationsTotal int64 `json:"invalidations_total"`
}

// denyCacheCollector exports the deny cache's counters, read once per
// scrape. Labels are fixed: the invalidation reasons.
type denyCacheCollector struct{ d *denycache.Store }

var (
	descDenyHits = prometheus.NewDesc("weir_deny_cache_hits_total",
		"Decisions answered from the deny cache (certain denials, without a Redis call).", nil, nil)
	descDenyHerd = prometheus.NewDesc("weir_deny_cache_herd_total",
		"Of the deny-cache hits, those that waited for another request on the same key whose cached denial had just lapsed, and were answered by the denial it brought back (a herd of one or two Redis calls instead of many).", nil, nil)
	descDenyMisses = prometheus.NewDesc("weir_deny_cache_misses_total",
		"Decisions the deny cache could not answer, sent to Redis (concurrency limits, peeks and decisions while the cache is bypassed are not counted).", nil, nil)
	descDenyInval = prometheus.NewDesc("weir_deny_cache_invalidations_total",
		"Deny-cache invalidations by reason: reset (a key reset or unblocked, here or on another instance), flush (a rule change), subscription (the invalidation channel was lost or came back).", []string{"reason"}, nil)
	descDenyEvict = prometheus.NewDesc("weir_deny_cache_evictions_total",
		"Live deny-cache entries dropped to make room (store.deny_cache_size).", nil, nil)
	descDenyEntries = prometheus.NewDesc("weir_deny_cache_entries",
		"Entries in the deny cache, lapsed ones included.", nil, nil)
	descDenyLive = prometheus.NewDesc("weir_deny_cache_live",
		"1 while the deny cache is in use, 0 while it is bypassed because its invalidation channel is not subscribed.", nil, nil)
)

func (c denyCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDenyHits, descDenyHerd, descDenyMisses, descDenyInval, descDenyEvict, descDenyEntries, descDenyLive} {
		ch <- d
	}
}

func (c denyCacheCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.d.Stats()
	ch <- prometheus.MustNewConstMetric(descDenyHits, prometheus.CounterValue, float64(st.Hits))
	ch <- prometheus.MustNewConstMetric(descDenyHerd, prometheus.CounterValue, float64(st.Herd))
	ch <- prometheus.MustNewConstMetric(descDenyMisses, prometheus.CounterValue, float64(st.Misses))
	for _, r := range denycache.Reasons() {
		ch <- prometheus.MustNewConstMetric(descDenyInval, prometheus.CounterValue, float64(st.Invalidations[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(descDenyEvict, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descDenyEntries, prometheus.GaugeValue, float64(st.Entries))
	live := 0.0
	if st.Live {
		live = 1
	}
	ch <- prometheus.MustNewConstMetric(descDenyLive, prometheus.GaugeValue, live)
}

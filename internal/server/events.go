package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/policy/config"
)

// Events: the rules with events (config: a rule's events) record their
// crossings in the store's decisions (internal/events); weir serve
// delivers them to the webhooks (one Deliverer per instance, on a
// background goroutine; on Redis the instances share the stream through
// a consumer group) and lists them on GET /v1/events.

// defaultThresholds are the thresholds of a rule with events when neither
// it nor the events section lists any.
var defaultThresholds = []float64{0.8, 0.95, 1.0}

// evConfig is the events part of the config in force.
type evConfig struct {
	hooks  map[string]string // rule → webhook URL
	secret []byte
	on     bool // some rule has events
}

// eventsOf resolves the config's events: each rule's thresholds and
// webhook, and the secret (read from its variable or file; never logged).
func (s *Server) eventsOf(cfg *config.Config) (map[string]events.Rule, *evConfig, error) {
	rules := map[string]events.Rule{}
	ec := &evConfig{hooks: map[string]string{}}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if !r.Events {
			continue
		}
		ts := r.EventThresholds
		if ts == nil {
			ts = cfg.EventThresholds
		}
		if ts == nil {
			ts = defaultThresholds
		}
		rules[r.Name] = events.Rule{Thresholds: ts}
		hook := r.EventWebhook
		if hook == "" {
			hook = cfg.EventWebhook
		}
		if hook != "" {
			ec.hooks[r.Name] = hook
		}
	}
	ec.on = len(rules) > 0
	if len(ec.hooks) > 0 {
		switch {
		case cfg.EventSecretEnv != "":
			lookup := s.o.lookupEnv
			if lookup == nil {
				lookup = os.LookupEnv
			}
			v, ok := lookup(cfg.EventSecretEnv)
			if !ok || v == "" {
				return nil, nil, fmt.Errorf("events.secret_env: the variable %s is not set", cfg.EventSecretEnv)
			}
			ec.secret = []byte(v)
		case cfg.EventSecretFile != "":
			b, err := os.ReadFile(cfg.EventSecretFile)
			if err != nil {
				return nil, nil, fmt.Errorf("events.secret_file: %w", err)
			}
			v := strings.TrimSpace(string(b))
			if v == "" {
				return nil, nil, fmt.Errorf("events.secret_file: %s is empty", cfg.EventSecretFile)
			}
			ec.secret = []byte(v)
		}
	}
	return rules, ec, nil
}

// applyEvents puts the config's events in force: the store's rules and
// the webhooks. A store that cannot record events (a Redis Cluster)
// refuses a config that asks for them.
func (s *Server) applyEvents(cfg *config.Config) error {
	rules, ec, err := s.eventsOf(cfg)
	if err != nil {
		return err
	}
	es, ok := events.Of(s.store)
	if !ok {
		if ec.on {
			return fmt.Errorf("events: the store %T records no events", s.store)
		}
		return nil
	}
	if err := es.SetEventRules(rules); err != nil {
		return err
	}
	s.evCfg.Store(ec)
	return nil
}

// eventCounters are the events' Prometheus metrics.
type eventCounters struct {
	kinds      *prometheus.CounterVec
	deliveries *prometheus.CounterVec
	dropped    prometheus.Counter
}

func newEventCounters(reg *prometheus.Registry) *eventCounters {
	c := &eventCounters{
		kinds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_events_total",
			Help: "Threshold events this instance read for delivery, by kind (threshold, refused, blocked, unblocked, override_expired). On Redis the instances share the stream: the fleet's sum counts each event once.",
		}, []string{"kind"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_webhook_deliveries_total",
			Help: "Webhook calls by result (delivered: a 2xx answer; failed; timeout). A failed or timed-out call is retried with backoff.",
		}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_events_dropped_total",
			Help: "Events the store's bound dropped before this instance could deliver them (a receiver down or slow for long).",
		}),
	}
	reg.MustRegister(c.kinds, c.deliveries, c.dropped)
	return c
}

// Event implements events.Counters.
func (c *eventCounters) Event(kind string) { c.kinds.WithLabelValues(kind).Inc() }

// Delivery implements events.Counters.
func (c *eventCounters) Delivery(result string) { c.deliveries.WithLabelValues(result).Inc() }

// Dropped implements events.Counters.
func (c *eventCounters) Dropped(n int64) { c.dropped.Add(float64(n)) }

// serverSource reads events for delivery while a rule has events.
type serverSource struct {
	s   *Server
	src events.Source
}

// Claim implements events.Source: nothing while no rule has events.
func (ss serverSource) Claim(ctx context.Context, n int) ([]events.Event, error) {
	if ec := ss.s.evCfg.Load(); ec == nil || !ec.on {
		return nil, nil
	}
	return ss.src.Claim(ctx, n)
}

// Ack implements events.Source.
func (ss serverSource) Ack(ctx context.Context, ids []string) error { return ss.src.Ack(ctx, ids) }

// eventLoop delivers the events' webhooks until ctx ends.
func (s *Server) eventLoop(ctx context.Context) {
	es, ok := events.Of(s.store)
	if !ok {
		return
	}
	var src events.Source = &events.Cursor{Store: es}
	g, grouped := es.(events.Grouped)
	if grouped {
		src = g.Group(s.id)
	}
	d := &events.Deliverer{
		Source:  serverSource{s, src},
		Requeue: grouped,
		URL: func(rule string) string {
			if ec := s.evCfg.Load(); ec != nil {
				return ec.hooks[rule]
			}
			return ""
		},
		Secret: func() []byte {
			if ec := s.evCfg.Load(); ec != nil {
				return ec.secret
			}
			return nil
		},
		Timeout:  s.o.webhookTimeout,
		Poll:     s.o.eventPoll,
		Counters: s.evCounters,
		Log:      s.log,
	}
	d.MinBackoff = s.o.webhookBackoff
	d.Run(ctx)
}

// sweepLoop runs the store's events sweeper (events.Store.Sweep) every
// poll interval (a second by default) until ctx ends: it records the
// unblocked event of each penalty box that ended and the override_expired
// event of each override whose until passed. Every instance sweeps; the
// store gives each due item to one of them.
func (s *Server) sweepLoop(ctx context.Context) {
	es, ok := events.Of(s.store)
	if !ok {
		return
	}
	every := s.o.eventPoll
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ec := s.evCfg.Load(); ec == nil || !ec.on {
			continue
		}
		for {
			n, err := es.Sweep(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("weir: the events sweep failed", "err", err)
				}
				break
			}
			if n == 0 {
				break
			}
		}
	}
}

// handleEvents serves GET /v1/events?since=&limit=: the events the store
// keeps after since, oldest first.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since := q.Get("since")
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > events.MaxList {
			writeError(w, http.StatusBadRequest, codeBadRequest, "limit %q must be a whole number from 1 to %d", v, events.MaxList)
			return
		}
		limit = n
	}
	out := []events.Event{}
	if es, ok := events.Of(s.store); ok {
		list, err := es.Events(r.Context(), since, limit)
		if err != nil {
			if errors.Is(err, events.ErrSince) {
				writeError(w, http.StatusBadRequest, codeBadRequest, "since %q is not an event id (an id from a previous answer)", since)
				return
			}
			writeError(w, http.StatusServiceUnavailable, codeStore, "the store failed: %v", err)
			return
		}
		out = append(out, list...)
	}
	next := since
	if len(out) > 0 {
		next = out[len(out)-1].ID
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": out, "next": next})
}

// evCfgPointer is the events config in force (nil before the first).
type evCfgPointer = atomic.Pointer[evConfig]

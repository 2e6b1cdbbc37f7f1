package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/internal/price"
	"github.com/weir-dev/weir/policy"
)

// admin wraps an admin API handler: it answers 404 while the admin API is
// off (no token configured), 401 without the right bearer token, and 429
// to a client that has failed too often (see adminAuth). The token is
// compared in constant time, on hashes so that not even its length leaks.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.adminToken == "" {
			writeError(w, http.StatusNotFound, codeAdminDisabled,
				"the admin API is off: set the environment variable %s to a secret token and restart weir, then send it as Authorization: Bearer <token>", s.adminEnv)
			return
		}
		if s.auth.check(w, r, true, s.adminEnv) != authAdmin {
			return
		}
		h(w, r)
	}
}

// ruleAndKey reads the rule and key query parameters, answering 400 when
// one is missing.
func ruleAndKey(w http.ResponseWriter, r *http.Request) (rule, key string, ok bool) {
	q := r.URL.Query()
	rule, key = q.Get("rule"), q.Get("key")
	switch {
	case rule == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter rule is required: ?rule=NAME&key=IDENTITY")
		return "", "", false
	case key == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter key is required: ?rule=NAME&key=IDENTITY")
		return "", "", false
	}
	return rule, key, true
}

// canonicalKey returns key as rule counts it (policy.CanonicalKey: an
// address under an ip rule in the form requests give it), so that the
// admin API reaches the counter /v1/auth and /v1/check use however the
// address is spelled. For a rule p does not know, key is returned as it
// is: the caller answers that.
func canonicalKey(p *policy.Policy, rule, key string) (string, error) {
	k, err := p.CanonicalKey(rule, key)
	if errors.Is(err, policy.ErrUnknownRule) {
		return key, nil
	}
	return k, err
}

// adminKey reads the rule and key of an admin request on one key, in the
// policy in force, with the key as that rule counts it (canonicalKey). When
// they are not usable it has written the error and ok is false.
func (s *Server) adminKey(w http.ResponseWriter, r *http.Request) (p *policy.Policy, rule, key string, ok bool) {
	rule, key, ok = ruleAndKey(w, r)
	if !ok {
		return nil, "", "", false
	}
	p = s.holder.Load()
	key, err := canonicalKey(p, rule, key)
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return nil, "", "", false
	}
	return p, rule, key, true
}

// handleStateGet serves GET /v1/state?rule=&key=[&tier=]: what the next
// request of key would get, without consuming anything.
func (s *Server) handleStateGet(w http.ResponseWriter, r *http.Request) {
	p, rule, key, ok := s.adminKey(w, r)
	if !ok {
		return
	}
	l, err := p.Limit(rule, r.URL.Query().Get("tier"))
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	// key may be a long identity's listed form, "~" and its hash.
	res, err := s.stack.Take(r.Context(), keys.KeyOfShort(rule, key), l, 0)
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	d := decisionOf(rule, res, false)
	d.Key = key
	writeJSON(w, http.StatusOK, d)
}

// handleStateDelete serves DELETE /v1/state?rule=&key=: the key's state
// under every tier of the rule is cleared, penalty box included.
func (s *Server) handleStateDelete(w http.ResponseWriter, r *http.Request) {
	p, rule, key, ok := s.adminKey(w, r)
	if !ok {
		return
	}
	if err := p.Reset(r.Context(), rule, key); err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	if err := s.blocked.remove(r.Context(), rule, key); err != nil {
		s.log.Warn("weir: removing a reset key from the penalty-box index failed", "rule", rule, "err", err)
	}
	s.log.Info("weir: admin reset a key", "rule", rule)
	writeJSON(w, http.StatusOK, map[string]any{"reset": true, "rule": rule, "key": key})
}

// handleBlockedGet serves GET /v1/blocked.
func (s *Server) handleBlockedGet(w http.ResponseWriter, r *http.Request) {
	list, err := s.blocked.list(r.Context())
	source := "local"
	if s.rdb != nil {
		source = "redis"
	}
	if err != nil {
		source = "local"
		s.log.Warn("weir: reading the penalty-box index from Redis failed; listing this instance's", "err", err)
	}
	writeJSON(w, http.StatusOK, map[string]any{"blocked": list, "source": source, "now_ms": s.now().UnixMilli()})
}

// handleBlockedDelete serves DELETE /v1/blocked?rule=&key=: the identity
// leaves the penalty box (its state is reset) and the list.
func (s *Server) handleBlockedDelete(w http.ResponseWriter, r *http.Request) {
	p, rule, key, ok := s.adminKey(w, r)
	if !ok {
		return
	}
	err := p.Reset(r.Context(), rule, key)
	if err != nil && !errors.Is(err, policy.ErrUnknownRule) {
		s.writeRuleError(w, p, rule, err)
		return
	}
	// A rule removed since the block has no state worth resetting; its
	// entry still leaves the list.
	if rerr := s.blocked.remove(r.Context(), rule, key); rerr != nil {
		writeError(w, http.StatusServiceUnavailable, codeStore, "the key was reset, but removing it from the penalty-box index in Redis failed: %v", rerr)
		return
	}
	s.log.Info("weir: admin unblocked a key", "rule", rule)
	writeJSON(w, http.StatusOK, map[string]any{"unblocked": true, "rule": rule, "key": key})
}

// envoyRuleInfo describes an Envoy descriptor rule in GET /v1/rules.
type envoyRuleInfo struct {
	Domain    string `json:"domain"`
	Path      string `json:"path"`
	Name      string `json:"name,omitempty"`
	Limit     string `json:"limit,omitempty"`
	Algorithm string `json:"algorithm,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	Shadow    bool   `json:"shadow,omitempty"`
}

// handleRulesGet serves GET /v1/rules: the rules in force, public.
func (s *Server) handleRulesGet(w http.ResponseWriter, r *http.Request) {
	p := s.holder.Load()
	out := map[string]any{
		"rules":  p.Rules(),
		"source": s.rules.source(),
	}
	var env []envoyRuleInfo
	for _, er := range s.envoy.Config().Rules() {
		ei := envoyRuleInfo{Domain: er.Domain, Path: er.Path, Name: er.Name, Unlimited: er.Unlimited, Shadow: er.Shadow}
		if !er.Unlimited {
			ei.Limit, ei.Algorithm = er.Limit.String(), string(er.Limit.Algorithm)
		}
		env = append(env, ei)
	}
	if len(env) > 0 {
		out["envoy"] = env
	}
	writeJSON(w, http.StatusOK, out)
}

// handleTop serves GET /v1/top?rule=&n=: the identities most often
// limited, per rule, heaviest first, from a space-saving sketch (count
// overestimates the true count by at most error). With Redis the lists of
// every instance are added up. Without the admin token the identities are
// redacted (see redactor).
func (s *Server) handleTop(w http.ResponseWriter, r *http.Request) {
	full, ok := s.readAccess(w, r)
	if !ok {
		return
	}
	ids := identitiesFull
	q := r.URL.Query()
	n := 10
	if v := q.Get("n"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 1 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "n=%q: want a whole number from 1 to %d", v, topK)
			return
		}
		n = min(i, topK)
	}
	tops := s.topView(n)
	if !full {
		tops, ids = s.redact.tops(tops), identitiesRedacted
	}
	rule := q.Get("rule")
	if rule == "" {
		writeJSON(w, http.StatusOK, map[string]any{"top": tops, "n": n, "identities": ids})
		return
	}
	list, ok := tops[rule]
	if !ok {
		p := s.holder.Load()
		if _, err := p.Limit(rule, ""); err != nil && !s.isEnvoyRule(rule) {
			s.writeRuleError(w, p, rule, err)
			return
		}
		list = []TopEntry{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"rule": rule, "top": list, "n": n, "identities": ids})
}

func (s *Server) isEnvoyRule(path string) bool {
	for _, er := range s.envoy.Config().Rules() {
		if er.Path == path {
			return true
		}
	}
	return false
}

// topView merges this instance's sketches with the fleet's, n per rule.
func (s *Server) topView(n int) map[string][]TopEntry {
	local := s.tops.all(topK)
	merged := mergeTops(append(s.fleet.remoteTops(), local)...)
	if len(s.fleet.remoteTops()) == 0 {
		merged = local // keep the error bounds of a single sketch
	}
	for rule, es := range merged {
		if len(es) > n {
			merged[rule] = es[:n]
		}
	}
	return merged
}

// handleHealthz serves /healthz: 200 while the process serves.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReadyz serves /readyz: 200 while this instance can answer
// (its config is loaded and it is not shutting down), 503 once it is
// shutting down. It does not depend on the store: during a store outage
// every instance still answers, by on_error, and taking them all out of
// rotation at once would defeat on_error. The store's health is
// /healthz/store.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "shutting_down"})
		return
	}
	body := map[string]any{"status": "ready", "store": s.storeInfo().Type, "store_healthy": s.healthy.Load()}
	if s.envoyDir != "" {
		// A refused reload leaves the last good config serving: still ready.
		body["envoy_config_stale"] = s.envoyState.stale.Load()
	}
	writeJSON(w, http.StatusOK, body)
}

// storeHealth is the body of /healthz/store.
type storeHealth struct {
	Status    string  `json:"status"` // up | down
	Store     string  `json:"store"`  // memory | redis | a custom store's type
	Breaker   string  `json:"breaker"`
	LatencyMS float64 `json:"latency_ms"`
	// LastError is when the store last failed a health probe (RFC 3339),
	// empty if never.
	LastError string `json:"last_error,omitempty"`
}

// handleStoreHealth serves /healthz/store: 200 when the store answers a
// peek within its timeout, 503 otherwise, with the circuit breaker's state
// and when a probe last failed. The weir_store_up gauge says the same to
// Prometheus.
func (s *Server) handleStoreHealth(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ok := s.probe(r.Context())
	h := storeHealth{Status: "up", Store: s.storeInfo().Type, Breaker: s.guard.State().String(),
		LatencyMS: float64(time.Since(start).Microseconds()) / 1000}
	if t := s.lastStoreErr.Load(); t != 0 {
		h.LastError = time.Unix(0, t).UTC().Format(time.RFC3339Nano)
	}
	code := http.StatusOK
	if !ok {
		h.Status, code = "down", http.StatusServiceUnavailable
	}
	writeJSON(w, code, h)
}

// spendEntry is one identity of GET /v1/spend: its settled cost, in the
// rule's units (a budget's: micro-units of its currency), over-estimated
// by at most Error; Amount is Count in units of the currency.
type spendEntry struct {
	Identity string `json:"identity"`
	Count    int64  `json:"count"`
	Error    int64  `json:"error"`
	Amount   string `json:"amount,omitempty"`
}

// handleSpend serves GET /v1/spend?rule=&n=: the identities that settled
// the most under rule (POST /v1/settle, WEIR.SETTLE) in the rule's
// current period, heaviest first, fleet-wide on Redis and per instance
// otherwise (spend.go); count overestimates the true sum by at most error.
func (s *Server) handleSpend(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rule := q.Get("rule")
	if rule == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter rule is required: ?rule=NAME")
		return
	}
	n := 10
	if v := q.Get("n"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 1 {
			writeError(w, http.StatusBadRequest, codeBadRequest, "n=%q: want a whole number from 1 to %d", v, topK)
			return
		}
		n = min(i, topK)
	}
	p := s.holder.Load()
	if _, err := p.Limit(rule, ""); err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	per, err := s.spendPeriod(p, rule)
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	top, err := s.spendTop(r.Context(), rule, per, n)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, codeStore, "%v", err)
		return
	}
	currency := ruleCurrency(p, rule)
	out := []spendEntry{}
	for _, e := range top {
		se := spendEntry{Identity: e.Identity, Count: e.Count, Error: e.Error}
		if currency != "" {
			se.Amount = price.Format(e.Count)
		}
		out = append(out, se)
	}
	scope := "instance"
	if s.rdb != nil {
		scope = "fleet"
	}
	body := map[string]any{"rule": rule, "n": n, "top": out, "period": per.json(), "scope": scope}
	if currency != "" {
		body["currency"] = currency
	}
	writeJSON(w, http.StatusOK, body)
}

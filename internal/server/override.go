package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/internal/override"
	"github.com/weir-dev/weir/internal/price"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/redisstore"
)

// Per-identity limit overrides: PUT, GET and DELETE /v1/overrides, and
// GET /v1/usage. The store keeps them and applies them in its decisions
// (internal/override); this file turns a rule and an identity into a
// store key and a rule's limit into the override's.

// overrideRequest is the body of PUT /v1/overrides.
type overrideRequest struct {
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Limit string `json:"limit"`
	Until string `json:"until,omitempty"`
	Note  string `json:"note,omitempty"`
}

// overrideJSON is an override as the API shows it.
type overrideJSON struct {
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Limit string `json:"limit"`
	Until string `json:"until,omitempty"`
	Note  string `json:"note,omitempty"`
}

// overrideStore returns the store's override side, or nil.
func (s *Server) overrideStore() override.Store {
	o, _ := s.store.(override.Store)
	return o
}

// overrideRefreshLoop reloads a Redis store's pattern overrides every
// second, the bound within which a pattern set on another instance
// applies here.
func (s *Server) overrideRefreshLoop(ctx context.Context) {
	rs, ok := s.store.(*redisstore.Store)
	if !ok {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A failure keeps the patterns it had and is not logged: the
			// store's outage is, once, by the tasks that report it.
			_ = rs.RefreshOverrides(ctx)
		}
	}
}

// overrideKey returns the store key an override of rule's identity key
// names: weir.Key(rule, key), or for a pattern ("acme-*") the prefix of
// every such key followed by "*".
func overrideKey(p *policy.Policy, rule, key string) (string, error) {
	if key == "" {
		return "", &override.Error{Field: "key", Reason: "empty"}
	}
	if prefix, pat := override.IsPattern(key); pat {
		switch {
		case strings.Contains(prefix, "*"):
			return "", &override.Error{Field: "key", Reason: fmt.Sprintf("%q: a pattern has one \"*\", at its end", key)}
		case len(prefix) > keys.MaxIdentityLen:
			return "", &override.Error{Field: "key", Reason: fmt.Sprintf("a pattern's prefix is at most %d bytes", keys.MaxIdentityLen)}
		case prefix == "":
			return weir.Key(rule) + ":*", nil
		}
		return weir.Key(rule, prefix) + "*", nil
	}
	if strings.Contains(key, "*") {
		return "", &override.Error{Field: "key", Reason: fmt.Sprintf("%q: a \"*\" may only end a pattern", key)}
	}
	k, err := canonicalKey(p, rule, key)
	if err != nil {
		return "", &override.Error{Field: "key", Reason: err.Error()}
	}
	return weir.Key(rule, k), nil
}

// writeOverrideError answers a bad override: 400 naming the field, 404
// for an unknown rule, 503 for a store failure.
func (s *Server) writeOverrideError(w http.ResponseWriter, p *policy.Policy, rule string, err error) {
	var oe *override.Error
	switch {
	case errors.As(err, &oe):
		writeError(w, http.StatusBadRequest, codeBadRequest, "field %s: %s", oe.Field, oe.Reason)
	case errors.Is(err, weir.ErrUnsupported):
		writeError(w, http.StatusBadRequest, codeBadRequest, "this store keeps no overrides: %v", err)
	default:
		s.writeRuleError(w, p, rule, err)
	}
}

// handleOverridePut serves PUT /v1/overrides.
func (s *Server) handleOverridePut(w http.ResponseWriter, r *http.Request) {
	if be := checkJSONContentType(r); be != nil {
		be.write(w)
		return
	}
	body, be := readBody(w, r)
	if be != nil {
		be.write(w)
		return
	}
	var req overrideRequest
	if be := decodeStrict(body, &req); be != nil {
		be.write(w)
		return
	}
	p := s.holder.Load()
	if req.Rule == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "field rule: required")
		return
	}
	base, err := p.Limit(req.Rule, "")
	if errors.Is(err, policy.ErrUnknownRule) {
		writeError(w, http.StatusNotFound, codeUnknownRule, "field rule: no rule is named %q; the rules in force are: %s", req.Rule, ruleNames(p))
		return
	}
	if err != nil {
		s.writeRuleError(w, p, req.Rule, err)
		return
	}
	key, err := overrideKey(p, req.Rule, req.Key)
	if err != nil {
		s.writeOverrideError(w, p, req.Rule, err)
		return
	}
	if req.Limit == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "field limit: required, as in \"20/m burst 5\"")
		return
	}
	l, err := override.Apply(base, req.Limit)
	if err != nil {
		s.writeOverrideError(w, p, req.Rule, err)
		return
	}
	o := override.Override{Key: key, Limit: l, Note: req.Note}
	if req.Until != "" {
		if o.Until, err = time.Parse(time.RFC3339, req.Until); err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, "field until: %q is not an RFC 3339 time such as 2030-01-31T00:00:00Z", req.Until)
			return
		}
	}
	os := s.overrideStore()
	if os == nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, "this store (%s) keeps no overrides", s.storeInfo().Type)
		return
	}
	if err := os.SetOverride(r.Context(), o); err != nil {
		s.writeOverrideError(w, p, req.Rule, err)
		return
	}
	s.dropDenials(r.Context(), key)
	s.log.Info("weir: admin set an override", "rule", req.Rule)
	writeJSON(w, http.StatusOK, overrideOut(req.Rule, req.Key, o))
}

// overrideOut renders o for the API.
func overrideOut(rule, key string, o override.Override) overrideJSON {
	out := overrideJSON{Rule: rule, Key: key, Limit: limitSpec(o.Limit), Note: o.Note}
	if !o.Until.IsZero() {
		out.Until = o.Until.UTC().Format(time.RFC3339)
	}
	return out
}

// limitSpec renders the part of l an override sets, in ParseLimit's syntax.
func limitSpec(l weir.Limit) string {
	return weir.Limit{Rate: l.Rate, Period: l.Period, Burst: l.Burst, Calendar: l.Calendar}.String()
}

// handleOverrideGet serves GET /v1/overrides?rule=.
func (s *Server) handleOverrideGet(w http.ResponseWriter, r *http.Request) {
	rule := r.URL.Query().Get("rule")
	p := s.holder.Load()
	if rule == "" {
		writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter rule is required: ?rule=NAME")
		return
	}
	if _, err := p.Limit(rule, ""); err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	os := s.overrideStore()
	out := []overrideJSON{}
	if os != nil {
		prefix := weir.Key(rule) + ":"
		list, err := os.Overrides(r.Context(), prefix)
		if err != nil {
			s.writeRuleError(w, p, rule, err)
			return
		}
		for _, o := range list {
			out = append(out, overrideOut(rule, strings.TrimPrefix(o.Key, prefix), o))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"rule": rule, "overrides": out})
}

// handleOverrideDelete serves DELETE /v1/overrides?rule=&key=.
func (s *Server) handleOverrideDelete(w http.ResponseWriter, r *http.Request) {
	rule, key, ok := ruleAndKey(w, r)
	if !ok {
		return
	}
	p := s.holder.Load()
	if _, err := p.Limit(rule, ""); err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	sk, err := overrideKey(p, rule, key)
	if err != nil {
		s.writeOverrideError(w, p, rule, err)
		return
	}
	deleted := false
	if os := s.overrideStore(); os != nil {
		if deleted, err = os.DeleteOverride(r.Context(), sk); err != nil {
			s.writeOverrideError(w, p, rule, err)
			return
		}
	}
	if deleted {
		s.dropDenials(r.Context(), sk)
		s.log.Info("weir: admin deleted an override", "rule", rule)
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": deleted, "rule": rule, "key": key})
}

// usageJSON is the body of GET /v1/usage.
type usageJSON struct {
	Rule         string        `json:"rule"`
	Key          string        `json:"key"`
	Limit        int64         `json:"limit"`
	Used         int64         `json:"used"`
	Remaining    int64         `json:"remaining"`
	ResetAfterMS int64         `json:"reset_after_ms"`
	Override     *overrideJSON `json:"override"`
	// A budget rule's currency, whose micro-units limit, used and
	// remaining count, and the same amounts in units as decimal strings.
	Currency        string `json:"currency,omitempty"`
	LimitAmount     string `json:"limit_amount,omitempty"`
	UsedAmount      string `json:"used_amount,omitempty"`
	RemainingAmount string `json:"remaining_amount,omitempty"`
}

// ruleCurrency returns the currency of p's budget rule named rule; "" for
// any other rule.
func ruleCurrency(p *policy.Policy, rule string) string {
	for _, ri := range p.Rules() {
		if ri.Name == rule {
			return ri.Currency
		}
	}
	return ""
}

// handleUsage serves GET /v1/usage?rule=&key=: a peek, never a take.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	p, rule, key, ok := s.adminKey(w, r)
	if !ok {
		return
	}
	l, err := p.Limit(rule, r.URL.Query().Get("tier"))
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	sk := weir.Key(rule, key)
	res, err := s.guard.Take(r.Context(), sk, l, 0)
	if err != nil {
		s.writeRuleError(w, p, rule, err)
		return
	}
	out := usageJSON{Rule: rule, Key: key, Limit: res.Limit, Remaining: res.Remaining,
		ResetAfterMS: (res.ResetAfter + time.Millisecond - 1).Milliseconds()}
	out.Used = max(res.Limit-res.Remaining, 0)
	if c := ruleCurrency(p, rule); c != "" {
		out.Currency = c
		out.LimitAmount, out.UsedAmount, out.RemainingAmount = price.Format(out.Limit), price.Format(out.Used), price.Format(out.Remaining)
	}
	if os := s.overrideStore(); os != nil {
		// The override in force: the key's own, else its longest pattern's.
		list, err := os.Overrides(r.Context(), weir.Key(rule)+":")
		if err == nil {
			if best := inForce(list, sk, s.now()); best != nil {
				j := overrideOut(rule, strings.TrimPrefix(best.Key, weir.Key(rule)+":"), *best)
				out.Override = &j
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// inForce returns the override that applies to the store key sk at now
// among list, as the stores choose it: sk's own, else the live pattern
// with the longest prefix of sk; nil if none.
func inForce(list []override.Override, sk string, now time.Time) *override.Override {
	var best *override.Override
	for i := range list {
		o := &list[i]
		if !o.Live(now) {
			continue
		}
		prefix, pat := o.Pattern()
		if !pat {
			if o.Key == sk {
				return o
			}
			continue
		}
		if strings.HasPrefix(sk, prefix) && (best == nil || len(o.Key) > len(best.Key)) {
			best = o
		}
	}
	return best
}

// dropDenials drops the deny cache's denials that a changed override of
// the store key sk may lift: sk's here at once, and through the bus on
// every other instance (which drop them when the message arrives); a
// pattern's, every key's.
func (s *Server) dropDenials(ctx context.Context, sk string) {
	if s.deny == nil {
		return
	}
	var err error
	if _, pat := override.IsPattern(sk); pat {
		err = s.deny.Flush(ctx)
	} else {
		err = s.deny.Invalidate(ctx, sk)
	}
	if err != nil {
		s.log.Warn("weir: publishing a deny-cache invalidation after an override change failed", "err", err)
	}
}

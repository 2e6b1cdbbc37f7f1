package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
)

// checkRequest is the body of POST /v1/check by rule and key.
type checkRequest struct {
	// Rule names a rule of the config.
	Rule string `json:"rule"`
	// Key is the identity to decide for: what the rule counts by, such as
	// a client IP or an API key.
	Key string `json:"key"`
	// Hits is the cost of the request, 1 when absent; 0 peeks.
	Hits *int64 `json:"hits"`
	// Tier picks a tier of a tiered rule; empty is the default tier.
	Tier string `json:"tier"`
	// Mode is "take" (the default), "debit" (always consume hits, into
	// debt if need be) or "refund" (give hits back).
	Mode string `json:"mode"`
}

// CheckAnswer is the answer of POST /v1/check and GET /v1/state.
type CheckAnswer struct {
	Rule    string `json:"rule"`
	Allowed bool   `json:"allowed"`
	// Limit is the quota: the rule's Rate, or Burst for bucket algorithms.
	Limit     int64 `json:"limit"`
	Remaining int64 `json:"remaining"`
	// RetryAfterMS is when a retry can succeed, in milliseconds rounded up;
	// 0 if allowed.
	RetryAfterMS int64 `json:"retry_after_ms"`
	// ResetAfterMS is when the quota is whole again, in milliseconds.
	ResetAfterMS int64 `json:"reset_after_ms"`
	// BlockedUntil is the end of the penalty box in Unix milliseconds, 0
	// when none holds the key.
	BlockedUntil int64 `json:"blocked_until"`
	// Key echoes the identity (GET /v1/state only).
	Key string `json:"key,omitempty"`
	// Tier is the tier applied.
	Tier string `json:"tier,omitempty"`
	// Shadow marks a shadow rule: Allowed is then always true and
	// ShadowLimited says what the rule would have decided.
	Shadow        bool `json:"shadow,omitempty"`
	ShadowLimited bool `json:"shadow_limited,omitempty"`
	// Fallback names the on_error policy that decided because the store
	// failed: allow, deny or local.
	Fallback string `json:"fallback,omitempty"`
	// DelayMS asks a shaping leaky bucket's caller to hold the request.
	DelayMS int64 `json:"delay_ms,omitempty"`
	// Error and Detail are set on a refusal (429) of POST /v1/check or
	// POST /v1/reserve: "rate_limited" and a sentence, as every error
	// body has them.
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// codeRateLimited is the error code of a refusal.
const codeRateLimited = "rate_limited"

// decisionStatus is the status of a decision's answer: 200 when allowed,
// 429 when refused, in which case d gets the error code and a detail. The
// JSON body stays authoritative: it says allowed true or false either way.
func decisionStatus(d *CheckAnswer) int {
	if d.Allowed {
		return http.StatusOK
	}
	d.Error = codeRateLimited
	d.Detail = fmt.Sprintf("rule %s refused the request; retry in %d ms", d.Rule, d.RetryAfterMS)
	if d.BlockedUntil > 0 {
		d.Detail = fmt.Sprintf("rule %s refused the request; the key is in the penalty box until %s", d.Rule,
			time.UnixMilli(d.BlockedUntil).UTC().Format(time.RFC3339))
	}
	return http.StatusTooManyRequests
}

// decisionOf renders a store result.
func decisionOf(rule string, res weir.Result, shadow bool) CheckAnswer {
	d := CheckAnswer{
		Rule:         rule,
		Allowed:      res.Allowed || shadow,
		Limit:        res.Limit,
		Remaining:    max(res.Remaining, 0),
		RetryAfterMS: ceilMS(res.RetryAfter),
		ResetAfterMS: ceilMS(res.ResetAfter),
		DelayMS:      ceilMS(res.Delay),
		Shadow:       shadow,
	}
	if shadow && !res.Allowed {
		d.ShadowLimited = true
	}
	if !res.BlockedUntil.IsZero() {
		d.BlockedUntil = res.BlockedUntil.UnixMilli()
	}
	return d
}

// ceilMS rounds d up to whole milliseconds, so that a client waiting that
// long is never early.
func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// handleCheck serves POST /v1/check.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	if be := checkCrossSite(r); be != nil {
		be.write(w)
		return
	}
	if be := checkJSONContentType(r); be != nil {
		be.write(w)
		return
	}
	body, be := readBody(w, r)
	if be != nil {
		be.write(w)
		return
	}
	// An object with a domain or descriptors is an Envoy-style request.
	if envoyShaped, hasRule := topKeys(body); envoyShaped {
		if hasRule {
			writeError(w, http.StatusBadRequest, codeBadRequest,
				`the body names both a rule and a domain; send {"rule","key","hits"} or {"domain","descriptors"}`)
			return
		}
		out, status, err := s.envoy.CheckJSON(r.Context(), body)
		if err != nil {
			writeError(w, status, errorCode(status), "%v", err)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write(append(out, '\n'))
		return
	}
	var req checkRequest
	if be := decodeStrict(body, &req); be != nil {
		be.write(w)
		return
	}
	hits := int64(1)
	if req.Hits != nil {
		hits = *req.Hits
	}
	switch {
	case req.Rule == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "rule" is required: the name of a rule (GET /v1/rules lists them)`)
		return
	case req.Key == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "key" is required: the identity to decide for, such as a client IP`)
		return
	case hits < 0:
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "hits" is %d; it must be 0 (peek) or more`, hits)
		return
	}
	mode, err := parseMode(req.Mode)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "mode" is %q; want "take", "debit" or "refund"`, req.Mode)
		return
	}
	p := s.holder.Load()
	rr, err := p.CheckKey(r.Context(), policy.KeyRequest{Rule: req.Rule, Tier: req.Tier, Key: req.Key, N: hits, Mode: mode})
	if err != nil {
		s.writeRuleError(w, p, req.Rule, err)
		return
	}
	d := decisionOf(rr.Rule, rr.Result, rr.Shadow)
	d.Tier, d.Fallback = rr.Tier, rr.Fallback
	st := []httplimit.Status{{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow}}
	httplimit.WriteHeaders(w.Header(), st, 0, formatter(p))
	status := http.StatusOK
	if mode == weir.ModeTake {
		// A debit or refund records a cost already spent: the answer
		// reports the key's state, not a refusal.
		status = decisionStatus(&d)
	}
	writeJSON(w, status, d)
}

// errorCode is the error code of an error answered with status.
func errorCode(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return codeTooLarge
	case http.StatusServiceUnavailable:
		return codeStore
	case http.StatusInternalServerError:
		return codeInternal
	}
	return codeBadRequest
}

// formatter returns the header formatter the config asks for.
func formatter(p *policy.Policy) httplimit.HeaderFormatter {
	return httplimit.DraftHeaders{Legacy: p.Config().Headers.Legacy}
}

// writeRuleError answers an error of CheckKey, Limit or Reset: 404 for an
// unknown rule, 400 for invalid input (a cost or limit the store refused
// as invalid included, whatever else the error wraps), 503 for a store
// failure.
func (s *Server) writeRuleError(w http.ResponseWriter, p *policy.Policy, rule string, err error) {
	ruleError(p, rule, err).write(w)
}

// ruleError is the answer writeRuleError writes for err.
func ruleError(p *policy.Policy, rule string, err error) *bodyError {
	switch {
	case errors.Is(err, policy.ErrUnknownRule):
		return &bodyError{http.StatusNotFound, codeUnknownRule, fmt.Sprintf("no rule is named %q; the rules in force are: %s", rule, ruleNames(p))}
	case errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrInvalidLimit):
		return &bodyError{http.StatusBadRequest, codeBadRequest, invalidText(err)}
	case errors.Is(err, weir.ErrStore):
		return &bodyError{http.StatusServiceUnavailable, codeStore, fmt.Sprintf("the store failed: %v", err)}
	}
	return &bodyError{http.StatusBadRequest, codeBadRequest, err.Error()}
}

// invalidText is the sentence of an invalid cost or limit, each layer's
// context said once: `rule "api": cost 1000 for key "api:k" is outside
// 0..5, ...` rather than `policy: rule "api": weir: invalid cost: cost
// 1000 ...`.
func invalidText(err error) string {
	msg := strings.TrimPrefix(err.Error(), "policy: ")
	for _, sentinel := range []error{weir.ErrInvalidCost, weir.ErrInvalidLimit} {
		msg = strings.Replace(msg, sentinel.Error()+": ", "", 1)
	}
	return msg
}

// ruleNames lists the rules in force for an error message.
func ruleNames(p *policy.Policy) string {
	rs := p.Rules()
	if len(rs) == 0 {
		return "(none)"
	}
	names := make([]string, 0, min(len(rs), 20))
	for i, r := range rs {
		if i == 20 {
			names = append(names, fmt.Sprintf("and %d more", len(rs)-20))
			break
		}
		names = append(names, r.Name)
	}
	return strings.Join(names, ", ")
}

// parseMode returns the weir.Mode named s, one of those a caller of weir serve
// may ask for: take, debit or refund; "" is weir.ModeTake.
func parseMode(s string) (weir.Mode, error) {
	switch s {
	case "", "take":
		return weir.ModeTake, nil
	case "debit":
		return weir.ModeDebit, nil
	case "refund":
		return weir.ModeRefund, nil
	}
	return 0, fmt.Errorf("%w: unknown mode %q (want take, debit or refund)", weir.ErrInvalidCost, s)
}

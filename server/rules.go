package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/policy"
)

// maxRulesBody is the largest rule set PUT /v1/rules accepts.
const maxRulesBody = 1 << 20

// The top-level sections a rule-set replacement may hold. store and server
// cannot change at run time.
var replaceable = map[string]bool{
	"rules": true, "allow": true, "deny": true, "trusted_proxies": true, "headers": true, "shadow": true,
}

// ruleSync holds the rule set that PUT /v1/rules put in force, which
// replaces the config file's rules (and whichever of allow, deny,
// trusted_proxies, headers and shadow it also has) until DELETE /v1/rules
// drops it. With Redis the replacement is stored under weir:config:rules
// and weir:config:rules:version is incremented; every instance polls the
// version and picks the new rules up within a second, and an instance that
// starts later finds them there.
type ruleSync struct {
	s *Server

	mu      sync.Mutex
	raw     []byte          // the YAML; nil when the config's rules are in force
	cfg     *policy.Config  // raw, parsed
	present map[string]bool // raw's top-level sections
	version string          // the last version seen in Redis
}

func newRuleSync(s *Server) *ruleSync { return &ruleSync{s: s} }

// parseReplacement parses and validates a rule-set replacement.
func parseReplacement(data []byte) (*policy.Config, map[string]bool, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("the body is not YAML: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, nil, errors.New("the body must be a YAML mapping with a rules: list, as in weir.yaml")
	}
	present := map[string]bool{}
	var bad []string
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		present[k.Value] = true
		if !replaceable[k.Value] {
			bad = append(bad, fmt.Sprintf("line %d: section %s cannot change at run time (only rules, allow, deny, trusted_proxies, headers and shadow can); change the config file instead", k.Line, k.Value))
		}
	}
	cfg, err := policy.Parse(data, "rules")
	if err != nil {
		return nil, nil, err
	}
	if len(bad) > 0 {
		return nil, nil, errors.New(strings.Join(bad, "; "))
	}
	if !present["rules"] {
		return nil, nil, errors.New("the body has no rules: section; PUT /v1/rules replaces the rule set, so send one (rules: [] for none)")
	}
	return cfg, present, nil
}

// overlay returns base with the replacement's sections, or base itself
// when there is no replacement.
func (rs *ruleSync) overlay(base *policy.Config) (*policy.Config, error) {
	rs.mu.Lock()
	ov, present := rs.cfg, rs.present
	rs.mu.Unlock()
	return overlayOn(base, ov, present), nil
}

func overlayOn(base, ov *policy.Config, present map[string]bool) *policy.Config {
	if ov == nil {
		return base
	}
	eff := *base
	eff.Rules = ov.Rules
	if present["allow"] {
		eff.Allow, eff.AllowValues = ov.Allow, ov.AllowValues
	}
	if present["deny"] {
		eff.Deny, eff.DenyValues = ov.Deny, ov.DenyValues
	}
	if present["trusted_proxies"] {
		eff.TrustedProxies = ov.TrustedProxies
	}
	if present["headers"] {
		eff.Headers = ov.Headers
	}
	if present["shadow"] {
		eff.Shadow = ov.Shadow
	}
	return &eff
}

func (rs *ruleSync) set(raw []byte, cfg *policy.Config, present map[string]bool) {
	rs.mu.Lock()
	rs.raw, rs.cfg, rs.present = raw, cfg, present
	rs.mu.Unlock()
}

// source says where the rules in force come from.
func (rs *ruleSync) source() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch {
	case rs.raw != nil && rs.s.rdb != nil:
		return "api (stored in Redis)"
	case rs.raw != nil:
		return "api"
	case rs.s.o.cfgPath != "":
		return "config file"
	case rs.s.o.cfg != nil:
		return "config"
	}
	return "built-in demo"
}

// loadInitial reads a replacement stored in Redis, before the first policy
// is built.
func (rs *ruleSync) loadInitial(ctx context.Context) error {
	rdb := rs.s.rdb
	if rdb == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res := rdb.DoMulti(ctx, rdb.B().Get().Key(rulesVersionKey).Build(), rdb.B().Get().Key(rulesKey).Build())
	version, err := res[0].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return err
	}
	raw, err := res[1].AsBytes()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			rs.version = version
			return nil
		}
		return err
	}
	rs.version = version
	cfg, present, err := parseReplacement(raw)
	if err != nil {
		rs.s.log.Error("weir: the rules stored in Redis are invalid; using the config's", "key", rulesKey, "err", err)
		return nil
	}
	rs.set(raw, cfg, present)
	rs.s.log.Info("weir: using the rules stored in Redis", "key", rulesKey, "rules", len(cfg.Rules))
	return nil
}

// run polls the version key and applies changes made by other instances.
func (rs *ruleSync) run(ctx context.Context) {
	if rs.s.rdb == nil {
		return
	}
	t := time.NewTicker(rs.s.o.rulesEvery)
	defer t.Stop()
	var lastErr time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := rs.poll(ctx); err != nil && ctx.Err() == nil && time.Since(lastErr) > 30*time.Second {
			lastErr = time.Now()
			rs.s.log.Warn("weir: polling Redis for rule changes failed", "err", err)
		}
	}
}

func (rs *ruleSync) poll(ctx context.Context) error {
	rdb := rs.s.rdb
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	version, err := rdb.Do(pctx, rdb.B().Get().Key(rulesVersionKey).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return err
	}
	rs.mu.Lock()
	same := version == rs.version
	rs.mu.Unlock()
	if same {
		return nil
	}
	raw, err := rdb.Do(pctx, rdb.B().Get().Key(rulesKey).Build()).AsBytes()
	if err != nil && !rueidis.IsRedisNil(err) {
		return err
	}
	rs.mu.Lock()
	rs.version = version
	rs.mu.Unlock()
	if raw == nil {
		rs.set(nil, nil, nil)
	} else {
		cfg, present, err := parseReplacement(raw)
		if err != nil {
			rs.s.metrics.reload(false)
			rs.s.log.Error("weir: the rules stored in Redis are invalid; the old rules stay in force", "version", version, "err", err)
			return nil
		}
		rs.set(raw, cfg, present)
	}
	p, err := rs.s.build(rs.s.base.Load())
	if err != nil {
		rs.s.metrics.reload(false)
		rs.s.log.Error("weir: the rules stored in Redis do not apply here; the old rules stay in force", "version", version, "err", err)
		return nil
	}
	rs.s.swap(p)
	rs.s.log.Info("weir: rules changed by another instance", "version", version, "rules", len(p.Rules()))
	return nil
}

// handleRulesPut serves PUT /v1/rules.
func (s *Server) handleRulesPut(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > maxRulesBody {
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, "the rule set is %d bytes; the limit is %d", r.ContentLength, maxRulesBody)
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRulesBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, "the rule set is over %d bytes", maxRulesBody)
			return
		}
		writeError(w, http.StatusBadRequest, codeBadRequest, "reading the body failed: %v", err)
		return
	}
	cfg, present, err := parseReplacement(raw)
	if err == nil {
		_, err = policy.New(overlayOn(s.base.Load(), cfg, present), s.guard)
	}
	if err != nil {
		writeRulesError(w, err)
		return
	}
	version, err := s.publishRules(r.Context(), raw)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, codeStore, "storing the rules in Redis failed: %v", err)
		return
	}
	p, err := s.applyRules(raw, cfg, present, version)
	if err != nil {
		writeRulesError(w, err)
		return
	}
	scope := "instance"
	if s.rdb != nil {
		scope = "fleet"
	}
	s.log.Info("weir: admin replaced the rules", "rules", len(p.Rules()), "scope", scope, "version", version)
	writeJSON(w, http.StatusOK, map[string]any{"replaced": true, "scope": scope, "version": version, "rules": p.Rules()})
}

// handleRulesDelete serves DELETE /v1/rules: the config's rules are back in
// force, on every instance with Redis.
func (s *Server) handleRulesDelete(w http.ResponseWriter, r *http.Request) {
	version, err := s.publishRules(r.Context(), nil)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, codeStore, "removing the rules from Redis failed: %v", err)
		return
	}
	p, err := s.applyRules(nil, nil, nil, version)
	if err != nil {
		writeRulesError(w, err)
		return
	}
	s.log.Info("weir: admin restored the config's rules", "rules", len(p.Rules()))
	writeJSON(w, http.StatusOK, map[string]any{"restored": true, "version": version, "rules": p.Rules()})
}

// publishRules stores raw (nil: removes it) in Redis for the whole fleet
// and bumps the version every instance polls, in one pipelined round trip
// (the rules land before the version that announces them). Without Redis
// it does nothing and returns an empty version.
func (s *Server) publishRules(ctx context.Context, raw []byte) (string, error) {
	if s.rdb == nil {
		return "", nil
	}
	write := s.rdb.B().Del().Key(rulesKey).Build()
	if raw != nil {
		write = s.rdb.B().Set().Key(rulesKey).Value(string(raw)).Build()
	}
	res := s.rdb.DoMulti(ctx, write, s.rdb.B().Incr().Key(rulesVersionKey).Build())
	if err := res[0].Error(); err != nil {
		return "", err
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return "", err
	}
	return fmt.Sprint(n), nil
}

// applyRules puts a run-time rule set (nil: the config's own) in force on
// this instance.
func (s *Server) applyRules(raw []byte, cfg *policy.Config, present map[string]bool, version string) (*policy.Policy, error) {
	rs := s.rules
	rs.mu.Lock()
	if version != "" {
		rs.version = version
	}
	rs.raw, rs.cfg, rs.present = raw, cfg, present
	rs.mu.Unlock()
	p, err := s.build(s.base.Load())
	if err != nil {
		return nil, err
	}
	s.swap(p)
	return p, nil
}

// writeRulesError answers 400 with every problem of a rule set.
func writeRulesError(w http.ResponseWriter, err error) {
	var ce *policy.ConfigError
	problems := []string{err.Error()}
	if errors.As(err, &ce) {
		problems = ce.Lines()
	}
	writeJSON(w, http.StatusBadRequest, map[string]any{
		"error":    "invalid_rules",
		"detail":   "the rule set was rejected; the old rules stay in force: " + strings.Join(problems, "; "),
		"problems": problems,
	})
}

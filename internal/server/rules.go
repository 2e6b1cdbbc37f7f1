package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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
	"github.com/weir-dev/weir/policy/config"
)

// maxRulesBody is the largest rule set PUT /v1/rules accepts.
const maxRulesBody = 1 << 20

// The top-level sections a rule-set replacement may hold. store and server
// cannot change at run time.
var replaceable = map[string]bool{
	"rules": true, "allow": true, "deny": true, "trusted_proxies": true, "client_ip_header": true, "headers": true, "shadow": true,
	"near_limit": true,
}

// ruleSync holds the rule set that PUT /v1/rules put in force, which
// replaces the config file's rules (and whichever of allow, deny,
// trusted_proxies, client_ip_header, headers, shadow and near_limit it also has) until DELETE /v1/rules
// drops it. With Redis the replacement is stored under
// <prefix>:config:rules, after a first line that carries its version, and
// the version is written to <prefix>:config:rules:version; every instance
// polls that key and picks the new rules up within a second, and an
// instance that starts later finds them there.
//
// A version is 128 random bits, never a counter: after Redis loses its
// data, or fails over to a replica that missed the last writes, a new
// version can never equal one an instance has already seen, so no
// instance keeps rules that Redis no longer has. Versions are compared for
// equality only.
type ruleSync struct {
	s *Server

	mu      sync.Mutex
	raw     []byte          // the YAML; nil when the config's rules are in force
	cfg     *config.Config  // raw, parsed
	present map[string]bool // raw's top-level sections
	version string          // the last version seen in Redis ("": none)
}

func newRuleSync(s *Server) *ruleSync { return &ruleSync{s: s} }

// rulesVersionLine starts the value of the rules key: the version, then
// the YAML. It is a YAML comment, so the value stays a valid rule set.
const rulesVersionLine = "# weir-rules-version: "

// newRulesVersion returns a version that no other write will ever have.
func newRulesVersion() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// storedRules encodes raw with its version for the rules key.
func storedRules(version string, raw []byte) string {
	return rulesVersionLine + version + "\n" + string(raw)
}

// splitStoredRules returns the version and the YAML of the rules key's
// value; the version is "" in a value written before versions were stored
// with the rules.
func splitStoredRules(v []byte) (version string, raw []byte) {
	rest, ok := bytes.CutPrefix(v, []byte(rulesVersionLine))
	if !ok {
		return "", v
	}
	line, body, ok := bytes.Cut(rest, []byte("\n"))
	if !ok {
		return "", v
	}
	return string(bytes.TrimSpace(line)), body
}

// parseReplacement parses and validates a rule-set replacement.
func parseReplacement(data []byte) (*config.Config, map[string]bool, error) {
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
			bad = append(bad, fmt.Sprintf("line %d: section %s cannot change at run time (only rules, allow, deny, trusted_proxies, client_ip_header, headers, shadow and near_limit can); change the config file instead", k.Line, k.Value))
		}
	}
	cfg, err := policy.Parse(data, "rules")
	if err == nil {
		err = CheckConfig(cfg, "rules")
	}
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
func (rs *ruleSync) overlay(base *config.Config) (*config.Config, error) {
	rs.mu.Lock()
	ov, present := rs.cfg, rs.present
	rs.mu.Unlock()
	return overlayOn(base, ov, present), nil
}

func overlayOn(base, ov *config.Config, present map[string]bool) *config.Config {
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
	if present["client_ip_header"] {
		eff.ClientIPHeader = ov.ClientIPHeader
	}
	if present["headers"] {
		eff.Headers = ov.Headers
	}
	if present["shadow"] {
		eff.Shadow = ov.Shadow
	}
	if present["near_limit"] {
		eff.NearLimit = ov.NearLimit
	}
	return &eff
}

func (rs *ruleSync) set(raw []byte, cfg *config.Config, present map[string]bool) {
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
	case !rs.s.o.demo():
		return "none (Envoy config only)"
	}
	return "built-in demo"
}

// readStored reads the stored version and replacement: the version key's
// value ("" if none), the rules key's YAML (nil if none) and the version
// written with it ("" if none).
func (rs *ruleSync) readStored(ctx context.Context, withRules bool) (version string, raw []byte, rawVersion string, err error) {
	rdb, k := rs.s.rdb, rs.s.keys
	version, err = rdb.Do(ctx, rdb.B().Get().Key(k.rulesVersion).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return "", nil, "", err
	}
	if !withRules {
		return version, nil, "", nil
	}
	// Read after the version: a writer stores the rules first, so these
	// are at least as new as the version read. Both keys are read on
	// their own, so they may live in different slots of a cluster.
	v, err := rdb.Do(ctx, rdb.B().Get().Key(k.rules).Build()).AsBytes()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return version, nil, "", nil
		}
		return "", nil, "", err
	}
	rawVersion, raw = splitStoredRules(v)
	return version, raw, rawVersion, nil
}

// loadInitial reads a replacement stored in Redis, before the first policy
// is built.
func (rs *ruleSync) loadInitial(ctx context.Context) error {
	if rs.s.rdb == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	version, raw, rawVersion, err := rs.readStored(ctx, true)
	if err != nil {
		return err
	}
	if rawVersion != "" {
		version = rawVersion
	}
	rs.version = version
	if raw == nil {
		return nil
	}
	cfg, present, err := parseReplacement(raw)
	if err != nil {
		rs.s.log.Error("weir: the rules stored in Redis are invalid; using the config's", "key", rs.s.keys.rules, "err", err)
		return nil
	}
	rs.set(raw, cfg, present)
	rs.s.log.Info("weir: using the rules stored in Redis", "key", rs.s.keys.rules, "version", version, "rules", len(cfg.Rules))
	return nil
}

// run polls the version key and applies changes made by other instances.
func (rs *ruleSync) run(ctx context.Context) {
	rs.s.redisLoop(ctx, rs.s.o.rulesEvery, false, rs.poll, "weir: polling Redis for rule changes failed",
		"weir: polling Redis for rule changes works again")
}

// errSuperseded says that the rules changed on this instance while a poll
// read Redis: the poll's reading may be older, and the next poll decides.
var errSuperseded = errors.New("the rules changed while Redis was read")

func (rs *ruleSync) poll(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	version, _, _, err := rs.readStored(pctx, false)
	if err != nil {
		return err
	}
	rs.mu.Lock()
	seen, had := rs.version, rs.raw != nil
	rs.mu.Unlock()
	if version == seen {
		return nil
	}
	version, raw, rawVersion, err := rs.readStored(pctx, true)
	if err != nil {
		return err
	}
	if raw != nil && rawVersion != "" {
		// The version written with the rules is theirs; the version key
		// may already be older (read before a write) or gone (lost).
		version = rawVersion
		if version == seen {
			return nil // in force already; only the version key moved or went
		}
	}
	if raw == nil && !had {
		// No replacement before, none now (a DELETE seen, or a Redis
		// that lost a version only): nothing to rebuild.
		rs.mu.Lock()
		if rs.version == seen {
			rs.version = version
		}
		rs.mu.Unlock()
		return nil
	}
	var cfg *config.Config
	var present map[string]bool
	if raw != nil {
		if cfg, present, err = parseReplacement(raw); err != nil {
			rs.mu.Lock()
			rs.version = version // tell it once, not on every poll
			rs.mu.Unlock()
			rs.s.metrics.reload(false)
			rs.s.log.Error("weir: the rules stored in Redis are invalid; the old rules stay in force", "version", version, "err", err)
			return nil
		}
	}
	// Under the holder's lock, as every change of the rules: nothing can
	// put an older policy in force after this one.
	p, err := rs.s.update(func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if rs.version != seen {
			return errSuperseded
		}
		rs.version = version
		rs.raw, rs.cfg, rs.present = raw, cfg, present
		return nil
	})
	switch {
	case errors.Is(err, errSuperseded):
		return nil
	case err != nil:
		rs.s.metrics.reload(false)
		rs.s.log.Error("weir: the rules stored in Redis do not apply here; the old rules stay in force", "version", version, "err", err)
		return nil
	case raw == nil && had && version == "":
		// Redis lost them: flushed, restarted without persistence, or a
		// failover to a replica that never had them. Redis is where the
		// replacement lives, so this instance goes back to its config, as
		// a new instance would; PUT /v1/rules again to restore them.
		rs.s.log.Warn("weir: the rules stored in Redis are gone (data lost or failover); back to the config's rules", "key", rs.s.keys.rules, "rules", len(p.Rules()))
	case raw == nil:
		rs.s.log.Info("weir: another instance restored the config's rules", "version", version, "rules", len(p.Rules()))
	default:
		rs.s.log.Info("weir: rules changed by another instance", "version", version, "rules", len(p.Rules()))
	}
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
// under a new version, written with the rules and then to the version key
// every instance polls, in one pipelined round trip (the rules land before
// the version that announces them). Without Redis it does nothing and
// returns an empty version.
func (s *Server) publishRules(ctx context.Context, raw []byte) (string, error) {
	if s.rdb == nil {
		return "", nil
	}
	version := newRulesVersion()
	write := s.rdb.B().Del().Key(s.keys.rules).Build()
	if raw != nil {
		write = s.rdb.B().Set().Key(s.keys.rules).Value(storedRules(version, raw)).Build()
	}
	for _, res := range s.rdb.DoMulti(ctx, write, s.rdb.B().Set().Key(s.keys.rulesVersion).Value(version).Build()) {
		if err := res.Error(); err != nil {
			return "", err
		}
	}
	return version, nil
}

// applyRules puts a run-time rule set (nil: the config's own) in force on
// this instance, under the holder's lock.
func (s *Server) applyRules(raw []byte, cfg *config.Config, present map[string]bool, version string) (*policy.Policy, error) {
	rs := s.rules
	return s.update(func() error {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		if version != "" {
			rs.version = version
		}
		rs.raw, rs.cfg, rs.present = raw, cfg, present
		return nil
	})
}

// writeRulesError answers 400 with every problem of a rule set.
func writeRulesError(w http.ResponseWriter, err error) {
	var ce *config.Error
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

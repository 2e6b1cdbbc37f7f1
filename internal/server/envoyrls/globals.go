package envoyrls

import (
	"crypto/sha256"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/yamlnode"
)

// Names of the response headers that WithResponseHeaders adds: those
// envoyproxy/ratelimit adds by default with LIMIT_RESPONSE_HEADERS_ENABLED.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// globals are the service-wide settings envoyproxy/ratelimit reads from its
// environment (SHADOW_MODE, QUOTA_MODE, LIMIT_RESPONSE_HEADERS_ENABLED), and
// the counters they need.
type globals struct {
	shadow, quota, headers bool

	shadowed       atomic.Uint64 // calls answered OK only because of shadow
	unknownDomains atomic.Uint64 // calls to a domain the config does not know
}

// WithShadowMode puts the whole service in shadow mode, as upstream's
// SHADOW_MODE: every descriptor is decided and counted, and its status is
// reported as decided (OVER_LIMIT included), but the call's overall_code is
// always OK. Observers still see Limited.
func WithShadowMode(on bool) Option { return func(s *Service) { s.g.shadow = on } }

// WithQuotaMode treats every descriptor as quota_mode, as upstream's
// QUOTA_MODE: the call is OVER_LIMIT only when every descriptor that is not
// unlimited is over its limit. Statuses are reported as decided.
func WithQuotaMode(on bool) Option { return func(s *Service) { s.g.quota = on } }

// WithResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset to response_headers_to_add, as upstream's
// LIMIT_RESPONSE_HEADERS_ENABLED.
func WithResponseHeaders(on bool) Option { return func(s *Service) { s.g.headers = on } }

// ShadowedCalls is how many calls were over the limit but answered OK
// because of WithShadowMode (upstream's global_shadow_mode counter).
func (s *Service) ShadowedCalls() uint64 { return s.g.shadowed.Load() }

// UnknownDomainCalls is how many calls named a domain the configuration in
// force does not know.
func (s *Service) UnknownDomainCalls() uint64 { return s.g.unknownDomains.Load() }

// applyGlobals applies the global settings to a response whose statuses
// are filled in; limited says which descriptors were decided OVER_LIMIT
// and over whether the call is, by the rules' own modes. It returns the
// overall verdict, after quota and shadow mode.
func (s *Service) applyGlobals(domain string, resp *rlspb.RateLimitResponse, items []item, limited []bool, over bool) bool {
	if !s.g.shadow && !s.g.quota && !s.g.headers {
		return over
	}
	if s.g.quota {
		// Upstream: every descriptor but the unlimited ones is a quota
		// descriptor, matched or not, so the call is over only when all of
		// them are.
		total, failed := 0, 0
		for i, it := range items {
			if it.rule != nil && it.rule.unlimited {
				continue
			}
			total++
			if limited[i] {
				failed++
			}
		}
		over = total > 0 && failed == total
	}
	if s.g.headers {
		if st := headerStatus(resp.Statuses, items, limited, s.g.quota); st != nil {
			resp.ResponseHeadersToAdd = []*corepb.HeaderValue{
				{Key: HeaderLimit, Value: strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)},
				{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
				{Key: HeaderReset, Value: strconv.FormatInt(s.unitReset(st.CurrentLimit.Unit), 10)},
			}
		}
	}
	if over && s.g.shadow {
		s.g.shadowed.Add(1)
		s.log.Debug("envoyrls: shadow mode: OVER_LIMIT answered OK", "domain", domain)
		over = false
	}
	return over
}

// headerStatus picks the status the response headers describe, as
// upstream does: the one with a current_limit and the least remaining
// (the first of equals), except that a descriptor over its limit that is
// not in quota mode wins, the last of them if several are.
func headerStatus(sts []*rlspb.RateLimitResponse_DescriptorStatus, items []item, limited []bool, globalQuota bool) *rlspb.RateLimitResponse_DescriptorStatus {
	var pick *rlspb.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range sts {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, least = st, st.LimitRemaining
		}
		quota := globalQuota || (items[i].rule != nil && items[i].rule.quota)
		if limited[i] && !quota {
			pick, least = st, 0
		}
	}
	return pick
}

// unitReset is upstream's RateLimit-Reset: the seconds to the end of the
// current unit (second, minute, …) on the epoch-aligned clock, whatever
// the unit_multiplier.
func (s *Service) unitReset(u rlspb.RateLimitResponse_RateLimit_Unit) int64 {
	sec := int64(unitDuration(u).Seconds())
	if sec <= 0 {
		return 0
	}
	now := s.now().Unix()
	return sec - now%sec
}

// LoadOptions change how LoadDirWith reads a configuration directory.
type LoadOptions struct {
	// MergeDomains lets several files define the same domain, as
	// upstream's MERGE_DOMAIN_CONFIG: each later file's top-level
	// descriptors join the domain's. A descriptor that is already defined
	// (same key and value) is still an error.
	MergeDomains bool
	// Reserve lets descriptors say reserve: (weir serve --envoy-reserve):
	// without it, a descriptor that does is refused.
	Reserve bool
}

// LoadDirWith is LoadDir with options.
func LoadDirWith(dir string, o LoadOptions) (*Config, error) {
	c, _, err := LoadDirDigest(dir, o)
	return c, err
}

// LoadDirDigest is LoadDirWith that also returns a digest of the file
// names and contents it loaded, the very bytes parsed, so that a caller
// can tell whether a directory changed since its last load.
func LoadDirDigest(dir string, o LoadOptions) (*Config, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	paths, err := dirFiles(dir)
	if err != nil {
		return nil, sum, err
	}
	h := sha256.New()
	c := &Config{domains: map[string]*domainConfig{}, merge: o.MergeDomains, reserveOK: o.Reserve}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, sum, fmt.Errorf("envoyrls: %w", err)
		}
		if err := c.add(data, p); err != nil {
			return nil, sum, err
		}
		fmt.Fprintf(h, "%d:%s%d:", len(p), p, len(data))
		h.Write(data)
	}
	copy(sum[:], h.Sum(nil))
	return c, sum, nil
}

// mergeInto adds a later file's descriptors to a domain already loaded.
// A top-level descriptor an earlier file defined is refused, as upstream
// does, naming this file's line.
func (p *parser) mergeInto(d *domainConfig, dl *yaml.Node) error {
	if dl == nil {
		return nil
	}
	if dl.Kind == yaml.SequenceNode {
		for _, item := range dl.Content {
			item = yamlnode.Resolve(item)
			if item.Kind != yaml.MappingNode {
				continue // p.level reports it
			}
			var kn, vn *yaml.Node
			for i := 0; i+1 < len(item.Content); i += 2 {
				switch item.Content[i].Value {
				case "key":
					kn = item.Content[i+1]
				case "value":
					vn = item.Content[i+1]
				}
			}
			if kn == nil || kn.Kind != yaml.ScalarNode || (vn != nil && vn.Kind != yaml.ScalarNode) {
				continue
			}
			dup := false
			if vn == nil || vn.Value == "" {
				dup = d.root.defaults[kn.Value] != nil
			} else { // wildcards too: every descriptor with a value is in exact
				dup = d.root.exact[entryKey{kn.Value, vn.Value}] != nil
			}
			if dup {
				what := fmt.Sprintf("key %q", kn.Value)
				if vn != nil && vn.Value != "" {
					what += fmt.Sprintf(" with value %q", vn.Value)
				}
				return yamlnode.Errorf(kn, "duplicate descriptor: %s is already defined by an earlier file of domain %q", what, d.name)
			}
		}
	}
	return p.level(&d.root, dl, d.name)
}

// dirFiles lists the configuration files of dir, as LoadDir reads them.
func dirFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	var paths []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p) // follows symlinks, as runtime directories use them
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %w", err)
		}
		if fi.Mode().IsRegular() {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("envoyrls: no .yaml or .yml files in %s", dir)
	}
	sort.Strings(paths)
	return paths, nil
}

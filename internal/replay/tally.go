package replay

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sort"
	"strings"
	"time"

	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// Report is what a replay found for one config: the JSON object `weir
// replay --json` prints, documented in docs/replay.md. The first seven
// fields are the stable schema; the rest were added after it.
type Report struct {
	Lines   int64        `json:"lines"`
	Skipped int64        `json:"skipped"`
	From    string       `json:"from"`
	To      string       `json:"to"`
	Rules   []RuleReport `json:"rules"`

	// Format is the log format read, such as "nginx combined".
	Format string `json:"format"`
	// SkippedLines names the first skipped lines, with why.
	SkippedLines []LineRef `json:"skipped_lines"`
	// Late counts lines older than a line already decided (beyond the
	// out-of-order window); they were decided at that line's time.
	Late      int64     `json:"late"`
	LateLines []LineRef `json:"late_lines"`
	// AllowListed and DenyListed count requests the allow and deny lists
	// decided before any rule.
	AllowListed int64 `json:"allow_listed"`
	DenyListed  int64 `json:"deny_listed"`
	// NotEvaluated lists what the log could not evaluate, and why.
	NotEvaluated []NotEvaluated `json:"not_evaluated"`
	// Notes are caveats about what the log records.
	Notes []string `json:"notes"`
	// Timeline has one entry per minute that had requests.
	Timeline []Minute `json:"timeline"`

	// limited holds each rule's limited identities with counts, for
	// --compare (bounded as the tally is; long identities shortened).
	limited map[string]map[string]int64
	// shadow says which rules are shadow rules.
	shadow map[string]bool
}

// RuleReport is one rule's line of a Report.
type RuleReport struct {
	Name string `json:"name"`
	// Matched counts the requests the rule applied to (a request without
	// its identity under on_missing: skip is not counted).
	Matched int64 `json:"matched"`
	// Limited counts the requests an enforced rule rejected (429, or 403
	// for on_missing: deny); ShadowLimited those a shadow rule would have.
	Limited       int64 `json:"limited"`
	ShadowLimited int64 `json:"shadow_limited"`
	// Identities counts the distinct identities the rule counted, and
	// LimitedIdentities those it limited (or would have, for a shadow
	// rule).
	Identities        int64 `json:"identities"`
	LimitedIdentities int64 `json:"limited_identities"`
	// Top lists the identities limited most, at most 10.
	Top []Top `json:"top"`
	// Approximate is set when more identities were seen than the tally
	// counts by name (65,536, or max_keys if fewer): the counts are then
	// estimates within about 2%, and Top ranks the limited identities
	// among the first max_keys.
	Approximate bool `json:"approximate,omitempty"`
}

// Top is one identity and how many of its requests were limited.
type Top struct {
	Identity string `json:"identity"`
	Limited  int64  `json:"limited"`
}

// Minute is one minute of the timeline.
type Minute struct {
	// Minute is its start, RFC 3339.
	Minute        string `json:"minute"`
	Requests      int64  `json:"requests"`
	Limited       int64  `json:"limited"`
	ShadowLimited int64  `json:"shadow_limited"`
}

// maxTop is how many identities Top lists.
const maxTop = 10

// maxMinutes bounds the timeline's minutes (about two years).
const maxMinutes = 1 << 20

// tally counts one config's decisions.
type tally struct {
	rules        []*ruleTally
	byName       map[string]*ruleTally
	minutes      map[int64]*Minute
	allow, deny  int64
	notEvaluated []NotEvaluated
	notes        []string
}

type ruleTally struct {
	name                   string
	shadow                 bool
	matched, limited, shad int64
	ids                    idSet
	limitedIDs             idSet
}

func newTally(cfg *config.Config, maxKeys int) *tally {
	t := &tally{byName: map[string]*ruleTally{}, minutes: map[int64]*Minute{}}
	seed := maphash.MakeSeed()
	for _, rc := range cfg.Rules {
		rt := &ruleTally{name: rc.Name, shadow: rc.Shadow || cfg.Shadow, ids: newIDSet(min(maxKeys, maxExactIDs), seed, false), limitedIDs: newIDSet(maxKeys, seed, true)}
		t.rules = append(t.rules, rt)
		t.byName[rc.Name] = rt
	}
	return t
}

// add counts one verdict, decided at now (µs).
func (t *tally) add(now int64, v *policy.Verdict) {
	m := t.minute(now)
	if m != nil {
		m.Requests++
	}
	if v.AllowListed {
		t.allow++
		return
	}
	if v.Denied && len(v.Results) == 0 {
		t.deny++
	}
	shadowLimited := false
	for i := range v.Results {
		rr := &v.Results[i]
		if rr.Skipped {
			continue
		}
		rt := t.byName[rr.Rule]
		if rt == nil {
			continue
		}
		rt.matched++
		if rr.Identity != "" {
			rt.ids.add(rr.Identity, 0)
		}
		if rr.Denied || !rr.Result.Allowed {
			if rr.Shadow {
				rt.shad++
				shadowLimited = true
			} else {
				rt.limited++
			}
			id := rr.Identity
			if rr.Denied {
				id = "(no identity: on_missing deny)"
			}
			// Kept as weir serve keeps a long identity: "~" and its hash.
			rt.limitedIDs.add(keys.ShortIdentity(id), 1)
		}
	}
	if m != nil {
		if !v.Allowed && len(v.Results) > 0 {
			m.Limited++
		}
		if shadowLimited {
			m.ShadowLimited++
		}
	}
}

func (t *tally) minute(now int64) *Minute {
	k := now / 60e6
	if now < 0 {
		k = (now - 60e6 + 1) / 60e6
	}
	m := t.minutes[k]
	if m == nil {
		if len(t.minutes) >= maxMinutes {
			return nil
		}
		m = &Minute{Minute: time.UnixMicro(k * 60e6).UTC().Format(time.RFC3339)}
		t.minutes[k] = m
	}
	return m
}

// report renders the tally.
func (t *tally) report(st *stats) *Report {
	r := &Report{
		Lines: st.lines, Skipped: st.skipped, Format: st.format,
		SkippedLines: nonNil(st.skippedLines), Late: st.late, LateLines: nonNil(st.lateLines),
		AllowListed: t.allow, DenyListed: t.deny, NotEvaluated: nonNil(t.notEvaluated), Notes: nonNil(t.notes),
		Rules: []RuleReport{}, Timeline: []Minute{}, limited: map[string]map[string]int64{}, shadow: map[string]bool{},
	}
	if st.to != 0 || st.from != 0 {
		r.From = time.UnixMicro(st.from).UTC().Format(time.RFC3339)
		r.To = time.UnixMicro(st.to).UTC().Format(time.RFC3339)
	}
	for _, rt := range t.rules {
		rr := RuleReport{
			Name: rt.name, Matched: rt.matched, Limited: rt.limited, ShadowLimited: rt.shad,
			Identities: rt.ids.count(), LimitedIdentities: rt.limitedIDs.count(),
			Approximate: rt.ids.over || rt.limitedIDs.over, Top: []Top{},
		}
		for id, n := range rt.limitedIDs.m {
			rr.Top = append(rr.Top, Top{Identity: id, Limited: n})
		}
		sortTop(rr.Top)
		if len(rr.Top) > maxTop {
			rr.Top = rr.Top[:maxTop]
		}
		r.Rules = append(r.Rules, rr)
		r.limited[rt.name] = rt.limitedIDs.m
		r.shadow[rt.name] = rt.shadow
	}
	keys := make([]int64, 0, len(t.minutes))
	for k := range t.minutes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, k := range keys {
		r.Timeline = append(r.Timeline, *t.minutes[k])
	}
	return r
}

func sortTop(ts []Top) {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Limited != ts[j].Limited {
			return ts[i].Limited > ts[j].Limited
		}
		return ts[i].Identity < ts[j].Identity
	})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// idSet counts distinct identities exactly up to a bound, and estimates
// beyond it (HyperLogLog), so that a log of any length takes bounded
// memory. With counts (limited identities) it keeps each identity's name
// (a long one as keys.ShortIdentity gives it, which the caller passes)
// and count; without (every identity seen) only a 64-bit hash of it,
// which is faster and smaller (a collision among 2^16 identities has odds
// of about 1 in 10^10).
type idSet struct {
	m      map[string]int64
	h      map[uint64]struct{}
	counts bool
	limit  int
	over   bool
	seed   maphash.Seed
	reg    []uint8
}

// hllBits sets the HyperLogLog's 2^hllBits registers: about 0.8% error.
const hllBits = 14

// maxExactIDs bounds the identities a rule counts exactly; beyond it, or
// beyond max_keys if smaller, Identities is an estimate. Limited
// identities are kept by name up to max_keys, for Top.
const maxExactIDs = 1 << 16

func newIDSet(limit int, seed maphash.Seed, counts bool) idSet {
	s := idSet{limit: limit, seed: seed, counts: counts, m: map[string]int64{}}
	if !counts {
		s.h = map[uint64]struct{}{}
	}
	return s
}

// add counts id, adding n to its count. Once the set is over its bound,
// an identity it does not hold only feeds the estimate.
func (s *idSet) add(id string, n int64) {
	if !s.counts {
		h := maphash.String(s.seed, id)
		if s.over {
			s.hllHash(h)
			return
		}
		if _, ok := s.h[h]; ok {
			return
		}
		if len(s.h) < s.limit {
			s.h[h] = struct{}{}
			return
		}
		s.overflow()
		s.hllHash(h)
		return
	}
	if c, ok := s.m[id]; ok {
		s.m[id] = c + n
		if s.over {
			s.hll(id)
		}
		return
	}
	if s.over {
		s.hll(id)
		return
	}
	if len(s.m) < s.limit {
		s.m[strings.Clone(id)] = n
		return
	}
	s.overflow()
	s.hll(id)
}

// overflow starts the estimate from what the set holds.
func (s *idSet) overflow() {
	s.over = true
	s.reg = make([]uint8, 1<<hllBits)
	for k := range s.m {
		s.hll(k)
	}
	for h := range s.h {
		s.hllHash(h)
	}
}

func (s *idSet) size() int { return len(s.m) + len(s.h) }

func (s *idSet) hll(id string) { s.hllHash(maphash.String(s.seed, id)) }

func (s *idSet) hllHash(h uint64) {
	i := h >> (64 - hllBits)
	rank := uint8(bits.LeadingZeros64(h<<hllBits|1<<(hllBits-1)) + 1)
	if rank > s.reg[i] {
		s.reg[i] = rank
	}
}

// count returns the number of distinct identities added.
func (s *idSet) count() int64 {
	if !s.over {
		return int64(s.size())
	}
	m := float64(len(s.reg))
	sum, zeros := 0.0, 0
	for _, r := range s.reg {
		sum += math.Ldexp(1, -int(r))
		if r == 0 {
			zeros++
		}
	}
	est := 0.7213 / (1 + 1.079/m) * m * m / sum
	if est <= 2.5*m && zeros > 0 {
		est = m * math.Log(m/float64(zeros))
	}
	return max(int64(est+0.5), int64(s.size()))
}

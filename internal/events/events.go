// Package events holds what the stores and weir serve share about
// threshold events: the Event record, a rule's event settings, the
// crossing check every store makes inside its atomic decision, the
// bounded ring the memory store keeps them in, and webhook delivery.
package events

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bounds.
const (
	// MaxThresholds is the most thresholds a rule may set.
	MaxThresholds = 8
	// MaxRules is the most rules with events a store tracks.
	MaxRules = 4096
	// DefaultBound is how many events a store keeps (the ring, or about
	// that many in the Redis stream) for readers and delivery.
	DefaultBound = 10000
	// MaxList is the most events one read returns.
	MaxList = 1000
)

// ErrSince: a since that is not an event ID.
var ErrSince = errors.New("events: since is not an event id")

// Kinds of event.
const (
	// KindThreshold: a decision took the key's usage in its window from
	// below Threshold×limit to at or above it.
	KindThreshold = "threshold"
	// KindRefused: the key's first refusal in its window.
	KindRefused = "refused"
	// KindBlocked: a decision put the key in its rule's penalty box (one
	// event per box, however long debt extends it).
	KindBlocked = "blocked"
	// KindUnblocked: the key's penalty box ended (Time is its end), or
	// was cleared by a reset (Time is the reset's).
	KindUnblocked = "unblocked"
	// KindOverrideExpired: the key's override (Key may be a pattern)
	// stopped applying at its until (Time).
	KindOverrideExpired = "override_expired"
)

// MaxDue is the most penalty-box ends and override expiries a store
// keeps waiting for its sweeper. A box entered while as many wait fires
// neither its blocked nor its unblocked event.
const MaxDue = 1 << 20

// Grace is how long past a box's end its marker is kept for the sweeper
// to announce the end: a sweeper stopped longer loses that event.
const Grace = time.Hour

// refusedBit is the marker bit of KindRefused; thresholds use bits 0..7.
const refusedBit = 1 << 15

// An Event is one crossing, recorded once per key, kind, threshold and
// window.
type Event struct {
	// ID orders events: "<ms>-<seq>", a Redis stream ID in redisstore.
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	Rule string    `json:"rule"`
	// Key is the identity, as the store key writes it (weir.Key's parts
	// after the rule).
	Key  string `json:"key"`
	Kind string `json:"kind"`
	// Threshold is the share of the limit crossed (KindThreshold), 0
	// otherwise.
	Threshold float64 `json:"threshold"`
	// Seq numbers the store's events from 1 without gaps: a reader that
	// sees one skipped knows how many the bound dropped.
	Seq uint64 `json:"-"`
}

// A Rule is a rule's event settings.
type Rule struct {
	// Thresholds are shares of the limit, ascending, each in (0, 1].
	Thresholds []float64
}

// Check validates r.
func (r *Rule) Check() error {
	if len(r.Thresholds) == 0 {
		return fmt.Errorf("events: no thresholds")
	}
	if len(r.Thresholds) > MaxThresholds {
		return fmt.Errorf("events: %d thresholds, more than %d", len(r.Thresholds), MaxThresholds)
	}
	for i, t := range r.Thresholds {
		if !(t > 0 && t <= 1) || math.IsNaN(t) {
			return fmt.Errorf("events: threshold %v must be above 0 and at most 1 (100%%)", t)
		}
		if i > 0 && t <= r.Thresholds[i-1] {
			return fmt.Errorf("events: thresholds must ascend: %v after %v", t, r.Thresholds[i-1])
		}
	}
	return nil
}

// Permille returns r's thresholds in thousandths, as the check counts
// them (the Lua script takes the same integers).
func (r *Rule) Permille() []int64 {
	out := make([]int64, len(r.Thresholds))
	for i, t := range r.Thresholds {
		out[i] = int64(math.Round(t * 1000))
	}
	return out
}

// Arg packs r's thresholds as the Redis script reads them: permille
// values joined by ",".
func (r *Rule) Arg() string {
	var b strings.Builder
	for i, p := range r.Permille() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(p, 10))
	}
	return b.String()
}

// Need is the usage at which a threshold of pm thousandths of limit is
// crossed: ceil(pm*limit/1000), at least 1.
func Need(pm, limit int64) int64 {
	return max((pm*limit+999)/1000, 1)
}

// A Marker records which events a key fired in its current window: a
// bit per threshold and one for the refusal, and when the window ends
// (µs). The stores keep it in the key's slot or hash, atomically with
// the state.
type Marker struct {
	Bits uint16
	End  int64
	// Box is the end (µs) of the penalty box whose blocked event fired
	// and whose unblocked event has not: 0 if none.
	Box int64
}

// BoxCheck is the penalty-box test a store makes beside Check, in the
// same atomic step: blocked is the decision's BlockedUntil (0 if none).
// It returns left, the end of an earlier box whose unblocked event fires
// now (it lapsed and the sweeper has not announced it yet), entered if a
// new box's blocked event fires, and moved if the announced box in force
// now ends later (debt extends it). m is updated.
func BoxCheck(m *Marker, now, blocked int64) (left int64, entered, moved bool) {
	if m.Box != 0 && m.Box <= now {
		left, m.Box = m.Box, 0
	}
	if blocked > now {
		switch {
		case m.Box == 0:
			m.Box, entered = blocked, true
		case blocked != m.Box:
			m.Box, moved = blocked, true
		}
	}
	return left, entered, moved
}

// Box makes a blocked (or, with left, unblocked) event of key under rule
// at t (µs).
func Box(rule, key string, t int64, left bool) Event {
	e := Event{Time: time.UnixMicro(t).UTC(), Rule: rule, Key: IdentityOf(key), Kind: KindBlocked}
	if left {
		e.Kind = KindUnblocked
	}
	return e
}

// Fired is one event a Check fires: a threshold's index, or -1 for the
// refusal.
type Fired = int

// Check is the crossing test every store makes inside its atomic
// decision: with the key's usage before and after the decision (limit -
// remaining, less and with what it granted), it fires each threshold
// crossed (before < need <= after) that m has not recorded in its
// window, and the first refusal (refused: a take of n > 0 was refused).
// windowEnd is when a window that starts now ends. It appends what fires
// to out and returns it; m is updated.
func Check(pm []int64, m *Marker, now, windowEnd, limit, remaining, granted int64, refused bool, out []Fired) []Fired {
	if m.End <= now {
		m.Bits, m.End = 0, 0
	}
	after := limit - remaining
	before := after - granted
	var fire uint16
	if granted > 0 {
		for i, p := range pm {
			need := Need(p, limit)
			if before < need && need <= after && m.Bits&(1<<i) == 0 {
				fire |= 1 << i
				out = append(out, i)
			}
		}
	}
	if refused && m.Bits&refusedBit == 0 {
		fire |= refusedBit
		out = append(out, -1)
	}
	if fire != 0 {
		if m.Bits == 0 {
			m.End = windowEnd
		}
		m.Bits |= fire
	}
	return out
}

// Make builds the Event a Check fired for the store key key under rule
// r at now (µs).
func Make(rule string, r *Rule, key string, f Fired, now int64) Event {
	e := Event{Time: time.UnixMicro(now).UTC(), Rule: rule, Key: IdentityOf(key), Kind: KindRefused}
	if f >= 0 {
		e.Kind, e.Threshold = KindThreshold, r.Thresholds[f]
	}
	return e
}

// IdentityOf returns the identity part of a store key, as events carry
// it: what follows the rule and its ":".
func IdentityOf(key string) string {
	_, id, _ := strings.Cut(key, ":")
	return id
}

// RuleOf returns the rule part of a store key (weir.Key's first part).
func RuleOf(key string) string {
	r, _, _ := strings.Cut(key, ":")
	return r
}

// Store is a store that records events in its decisions. memstore and
// redisstore implement it.
type Store interface {
	// SetEventRules replaces the rules whose decisions record events,
	// by rule name (weir.Key's first part). An empty map turns events off.
	SetEventRules(rules map[string]Rule) error
	// Events returns up to n events recorded after the event since ("" for
	// the oldest kept), oldest first.
	Events(ctx context.Context, since string, n int) ([]Event, error)
	// Sweep records the events of what fell due without a decision: the
	// unblocked event of each penalty box that ended, and the
	// override_expired event of each override whose until passed. Each is
	// claimed once, however many instances sweep at once. It returns how
	// many it recorded.
	Sweep(ctx context.Context) (int, error)
}

var (
	adaptersMu sync.Mutex
	adapters   []func(any) Store
)

// Register adds a way to find the events.Store of a store: memstore and
// redisstore register theirs, whose methods are unexported.
func Register(f func(any) Store) {
	adaptersMu.Lock()
	defer adaptersMu.Unlock()
	adapters = append(adapters, f)
}

// Of returns the events.Store of store, if it records events.
func Of(store any) (Store, bool) {
	if s, ok := store.(Store); ok {
		return s, true
	}
	adaptersMu.Lock()
	defer adaptersMu.Unlock()
	for _, f := range adapters {
		if s := f(store); s != nil {
			return s, true
		}
	}
	return nil, false
}

// CheckRules validates a rule set.
func CheckRules(rules map[string]Rule) error {
	if len(rules) > MaxRules {
		return fmt.Errorf("events: %d rules, more than %d", len(rules), MaxRules)
	}
	for name, r := range rules {
		if err := r.Check(); err != nil {
			return fmt.Errorf("rule %q: %w", name, err)
		}
	}
	return nil
}

// A Ring keeps the latest events of a memory store, up to its bound.
type Ring struct {
	mu    sync.Mutex
	buf   []Event
	seq   uint64 // the sequence number of the next event
	bound int
}

// NewRing returns a ring that keeps the last bound events.
func NewRing(bound int) *Ring {
	if bound <= 0 {
		bound = DefaultBound
	}
	return &Ring{bound: bound}
}

// Add appends e, giving it its ID.
func (g *Ring) Add(e Event) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	e.ID = strconv.FormatInt(e.Time.UnixMilli(), 10) + "-" + strconv.FormatUint(g.seq, 10)
	e.Seq = g.seq
	if len(g.buf) < g.bound {
		g.buf = append(g.buf, e)
		return
	}
	g.buf[int((g.seq-1)%uint64(g.bound))] = e
}

// SeqOf returns the sequence part of an event ID ("" is 0).
func SeqOf(id string) (uint64, error) {
	if id == "" {
		return 0, nil
	}
	_, s, ok := strings.Cut(id, "-")
	v, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("%w: %q", ErrSince, id)
	}
	return v, nil
}

// Since returns up to n events after since, oldest first.
func (g *Ring) Since(since string, n int) ([]Event, error) {
	after, err := SeqOf(since)
	if err != nil {
		return nil, err
	}
	n = min(max(n, 0), MaxList)
	g.mu.Lock()
	defer g.mu.Unlock()
	oldest := g.seq - uint64(len(g.buf)) + 1 // the seq of the oldest kept
	if after+1 < oldest {
		after = oldest - 1
	}
	var out []Event
	for s := after + 1; s <= g.seq && len(out) < n; s++ {
		out = append(out, g.buf[int((s-1)%uint64(g.bound))])
	}
	return out, nil
}

// Sorted returns a copy of rules' names, sorted: for stable output.
func Sorted(rules map[string]Rule) []string {
	names := make([]string, 0, len(rules))
	for n := range rules {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

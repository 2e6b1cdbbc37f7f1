// Package override holds what the stores and weir serve share about
// per-identity limit overrides: the Override record, its checks, the
// pattern match and the bounds.
package override

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// Bounds on what request input can grow.
const (
	// MaxOverrides is the most overrides a store holds (exact keys and
	// patterns together).
	MaxOverrides = 10000
	// MaxNote is the longest note, in bytes.
	MaxNote = 256
	// MaxLog is the length of the audit log: older changes are dropped.
	MaxLog = 1000
	// MaxKey is the longest store key an override may name.
	MaxKey = 512
)

// An Override gives one store key, or every key that starts with a
// pattern's prefix, its own limit, optionally until a time.
type Override struct {
	// Key is a store key (weir.Key(rule, identity)), or a pattern: a
	// prefix followed by "*".
	Key   string     `json:"key"`
	Limit weir.Limit `json:"limit"`
	// Until, if not zero, is when the override stops applying, by the
	// store's clock.
	Until time.Time `json:"until,omitzero"`
	Note  string    `json:"note,omitempty"`
}

// Pattern reports whether o.Key is a pattern, and its prefix.
func (o *Override) Pattern() (string, bool) { return IsPattern(o.Key) }

// IsPattern reports whether key is a pattern (ends in "*"), and its prefix.
func IsPattern(key string) (string, bool) {
	return strings.CutSuffix(key, "*")
}

// Live reports whether o applies at now.
func (o *Override) Live(now time.Time) bool { return o.Until.IsZero() || now.Before(o.Until) }

// A Change is one entry of the audit log.
type Change struct {
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	// Op is "set" or "delete".
	Op       string   `json:"op"`
	Override Override `json:"override"`
}

// Store is a weir.Store that keeps overrides and applies them in its
// decisions. memstore and redisstore implement it.
type Store interface {
	weir.Store
	// SetOverride stores o, replacing any override of the same key, and
	// appends the change to the audit log. When it returns, every
	// decision on an exact key decides under o.
	SetOverride(ctx context.Context, o Override) error
	// DeleteOverride removes key's override and reports whether there was one.
	DeleteOverride(ctx context.Context, key string) (bool, error)
	// Overrides lists the overrides whose keys start with prefix, live or
	// not yet swept, sorted by key.
	Overrides(ctx context.Context, prefix string) ([]Override, error)
	// OverrideLog returns the audit log's last n changes, oldest first.
	OverrideLog(ctx context.Context, n int) ([]Change, error)
}

// Error is a bad override, naming the field at fault.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("override: %s: %s", e.Field, e.Reason) }

// Check validates o as a store takes it: a key, a pattern with a single
// trailing "*", a limit that compiles, a note within bounds. now is the
// store's clock: an Until not after it is refused.
func Check(o *Override, now time.Time) error {
	if o.Key == "" || o.Key == "*" {
		return &Error{"key", "empty key"}
	}
	if len(o.Key) > MaxKey {
		return &Error{"key", fmt.Sprintf("%d bytes, more than %d", len(o.Key), MaxKey)}
	}
	prefix, _ := IsPattern(o.Key)
	if strings.Contains(prefix, "*") {
		return &Error{"key", fmt.Sprintf("%q: a pattern has one \"*\", at its end", o.Key)}
	}
	if len(o.Note) > MaxNote {
		return &Error{"note", fmt.Sprintf("%d bytes, more than %d", len(o.Note), MaxNote)}
	}
	if !utf8.ValidString(o.Note) {
		return &Error{"note", "not valid UTF-8"}
	}
	if !o.Until.IsZero() && !o.Until.After(now) {
		return &Error{"until", fmt.Sprintf("%s is not in the future", o.Until.UTC().Format(time.RFC3339))}
	}
	if _, err := o.Limit.Compile(); err != nil {
		return &Error{"limit", err.Error()}
	}
	return nil
}

// Apply returns the limit a rule's limit base becomes under the limit
// written spec ("20/m burst 5", weir.ParseLimit's syntax): spec's rate
// and burst, base's every other setting (algorithm, penalty box
// and its escalation, shaping, warm-up, calendar zone), so that the
// key's state and penalty history carry over. A spec that changes what
// the state means (another period or calendar unit, another number of
// buckets) or that base's algorithm refuses is an error naming the
// field "limit".
func Apply(base weir.Limit, spec string) (weir.Limit, error) {
	p, err := weir.ParseLimit(spec)
	if err != nil {
		return weir.Limit{}, &Error{"limit", err.Error()}
	}
	if p.Calendar != base.Calendar {
		return weir.Limit{}, &Error{"limit", fmt.Sprintf("%q: an override keeps the rule's window (%s)", spec, base.String())}
	}
	if p.Buckets != 0 && p.Buckets != base.Buckets {
		return weir.Limit{}, &Error{"limit", fmt.Sprintf("%q: an override keeps the rule's %d buckets", spec, base.Buckets)}
	}
	bk, _ := base.Algorithm.Kind()
	if p.Period != base.Period && p.Calendar == 0 && !isBucket(bk) {
		return weir.Limit{}, &Error{"limit", fmt.Sprintf("%q: an override keeps the rule's period (%s), so that the count goes on in the same windows", spec, base.String())}
	}
	l := base
	if isBucket(bk) {
		l.Period = p.Period
	}
	l.Rate, l.Burst = p.Rate, p.Burst
	po, err := l.Compile()
	if err != nil {
		return weir.Limit{}, &Error{"limit", err.Error()}
	}
	if isBucket(po.Kind) {
		// A bucket's state is a level in units of 1/B µs of refill: the
		// override must count in the same units for its level to mean
		// the same time of refill (docs/algorithms.md, "Overrides"). Its
		// period may differ: 10/m and 2/s both count in µs.
		pb, err := base.Compile()
		if err == nil && pb.B != po.B {
			return weir.Limit{}, &Error{"limit", fmt.Sprintf("%q: a %s override must refill in the rule's units: its rate divided by gcd(rate, period in µs) must be %d, as the rule's is, not %d (for a rule whose rate divides its period, pick a rate that divides its own period in µs too, such as 2/s or 30/m)", spec, po.Kind, pb.B, po.B)}
		}
	}
	return l, nil
}

// isBucket reports whether k keeps a level in units of refill time (token
// bucket, leaky bucket, GCRA) rather than a count in windows.
func isBucket(k algorithm.Kind) bool {
	return k == algorithm.TokenBucket || k == algorithm.LeakyBucket || k == algorithm.GCRA
}

// units returns the B of a bucket's l (algorithm.Params): its level
// counts in units of 1/B µs of refill, B = rate / gcd(rate, period in µs).
func units(l weir.Limit) int64 {
	r, p := l.Rate, l.Period.Microseconds()
	if r <= 0 || p <= 0 {
		return 0
	}
	a, b := r, p
	for b != 0 {
		a, b = b, a%b
	}
	return r / a
}

// Compatible reports whether l can replace base on a live key: the same
// algorithm (the state's key and shape), the same period (so the same
// windows; a bucket's may differ in the same units, its level being
// refill time: an override made for a rule that a reload gave other
// units stops applying), calendar,
// buckets, warm-up, and shaping or policing. Apply's limits always are; an
// override stops applying to a rule whose period a reload changed.
func Compatible(base, l weir.Limit) bool {
	bk, _ := base.Algorithm.Kind()
	lk, _ := l.Algorithm.Kind()
	return bk == lk && (!isBucket(bk) && base.Period == l.Period || isBucket(bk) && units(base) == units(l)) && base.Calendar == l.Calendar && base.Timezone == l.Timezone && base.ResetAt == l.ResetAt &&
		base.Buckets == l.Buckets && (base.Warmup == 0) == (l.Warmup == 0) && (base.MaxDelay == 0) == (l.MaxDelay == 0)
}

// Shape renders what Compatible compares, so that two limits are
// compatible exactly when their shapes are equal: the Redis scripts
// compare the override's with the caller's limit's. It holds no '|', ';',
// ',' or '='.
func Shape(l weir.Limit) string {
	k, _ := l.Algorithm.Kind()
	w := 0
	if l.Warmup != 0 {
		w = 1
	}
	if l.MaxDelay != 0 {
		w += 2
	}
	tz := strings.NewReplacer("|", "%7C", ";", "%3B", ",", "%2C", "=", "%3D").Replace(l.Timezone)
	period := int64(l.Period)
	if isBucket(k) {
		period = -units(l) // Compatible compares a bucket's units, not its period
	}
	return fmt.Sprintf("%s.%d.%d.%d.%d.%d.%s", k, period, l.Buckets, w, l.Calendar, l.ResetAt, tz)
}

// Patterns is an immutable set of pattern overrides, longest prefix first.
type Patterns []Override

// Match returns the live pattern override with the longest prefix of
// key, or nil.
func (ps Patterns) Match(key string, now time.Time) *Override {
	for i := range ps {
		prefix := ps[i].Key[:len(ps[i].Key)-1]
		if strings.HasPrefix(key, prefix) && ps[i].Live(now) {
			return &ps[i]
		}
	}
	return nil
}

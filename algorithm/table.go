package algorithm

import (
	"fmt"
	"strings"
)

// The algorithms' names, as configurations and the Redis scripts spell
// them. This is the one place in weir's Go code that writes them out:
// package weir's Algorithm constants, the Redis store's script files,
// every "want one of" list and every "applies to" message derive from
// the table below.
const (
	NameFixedWindow   = "fixed_window"
	NameSlidingLog    = "sliding_log"
	NameSlidingWindow = "sliding_window"
	NameTokenBucket   = "token_bucket"
	NameLeakyBucket   = "leaky_bucket"
	NameGCRA          = "gcra"
	NameConcurrency   = "concurrency"
)

// Kind names an algorithm.
type Kind uint8

// The seven algorithms.
const (
	FixedWindow Kind = iota + 1
	SlidingLog
	SlidingWindow
	TokenBucket
	LeakyBucket
	GCRA
	Concurrency
)

// Field is one setting of a limit, or (as Spec.Takes) a set of them.
type Field uint16

// The settings of a limit. Every algorithm takes a rate and a period;
// Spec.Takes says which of the others it takes.
const (
	FieldAlgorithm Field = 1 << iota
	FieldRate
	FieldPeriod
	FieldBurst
	FieldBlock
	FieldMaxDelay
	FieldDelayAfter
	FieldBuckets
	// FieldLease is a rule's lease (weir.yaml's lease: N): an instance
	// takes up to N units at once from the shared store and spends them
	// locally (package store/localbudget). It is not part of a limit, so
	// Compile never sees it; the table only says which algorithms accept
	// it: those whose count changes only by the window or bucket an event
	// falls in, so that an event spent later in the same window counts
	// exactly as it did when its unit was taken.
	FieldLease
	// FieldForgetAfter: how long an escalating penalty's history lasts
	// (penalty.go).
	FieldForgetAfter
	// FieldCalendar, FieldTimezone, FieldResetAt: calendar windows
	// (calendar.go): the unit (a limit per day, week or month), the time
	// zone and the time of day a window starts.
	FieldCalendar
	FieldTimezone
	FieldResetAt
	// FieldWarmup: a bucket's cold start (warmup.go).
	FieldWarmup
)

// String returns the field's name as a configuration key, such as
// "max_delay", or the names of a set joined by "+".
func (f Field) String() string {
	names := [...]string{"algorithm", "rate", "period", "burst", "block", "max_delay", "delay_after", "buckets", "lease", "forget_after", "calendar", "timezone", "reset_at", "warmup"}
	var b strings.Builder
	for i, n := range names {
		if f&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte('+')
			}
			b.WriteString(n)
		}
	}
	if b.Len() == 0 {
		return fmt.Sprintf("field(%d)", uint16(f))
	}
	return b.String()
}

// Feature is something an algorithm supports beyond deciding a request,
// or (as Spec.Supports) a set of them.
type Feature uint8

// The features.
const (
	// featurePeek: a cost of 0 reports without consuming.
	featurePeek Feature = 1 << iota
	// featureAtMost: a request may be granted in part (Mode AtMost).
	featureAtMost
	// featureRefund: Refund gives back what an admitted Take granted.
	featureRefund
	// featureShaping: with MaxDelay, admitted requests may be delayed
	// instead of rejected.
	featureShaping
	// FeatureLeases: an admitted request holds a lease that Release gives
	// back, or that expires after Period.
	FeatureLeases
	// FeatureDebt: Debit consumes past the limit (debt) and Credit gives
	// back (see Params.Debts for the settings that exclude it).
	FeatureDebt
)

// Spec is one algorithm's row in the table: its name, the settings it
// takes beyond rate and period, what it supports, and its functions.
type Spec struct {
	Kind     Kind
	Name     string
	Takes    Field   // the optional settings it accepts; FieldRate and FieldPeriod are implied
	Supports Feature // what it supports
	// Bucket: the state fills or drains continuously, the capacity (Cap,
	// the reported limit) is Burst, and MaxWait is a full refill.
	Bucket bool

	decide  decideFunc
	refund  func(p *Params, s *State, takeNow, now, g int64, id string) bool
	compile func(p *Params) error                      // checks and derives what only this algorithm needs
	life    func(p *Params, s *State, now int64) int64 // nil: the state lasts ResetAfter
	// debit consumes n past the limit; credit gives n back (debt.go).
	debit, credit func(p *Params, s *State, now, n int64)
}

// decideFunc is an algorithm's decision (the Lua's ALG.<name>.decide): it
// decides a request of cost at now against s and, if apply, consumes what
// it grants. It returns an Outcome's Granted, Remaining, RetryAfter,
// ResetAfter and Delay: five integers come back in registers, where a
// Outcome would be copied through memory (see TakeTo). The Outcome's
// Limit is Cap; take sets the rest.
type decideFunc func(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64)

// every is what all seven algorithms support.
const every = featurePeek | featureAtMost | featureRefund

// specs is the table, indexed by Kind. It is filled in by init, as its
// functions' error messages name algorithms through it.
var specs [Concurrency + 1]Spec

func init() {
	specs = [...]Spec{
		FixedWindow: {
			Kind: FixedWindow, Name: NameFixedWindow, Takes: FieldBlock | FieldLease | FieldForgetAfter | FieldCalendar | FieldTimezone | FieldResetAt, Supports: every | FeatureDebt,
			decide: fixedWindow, refund: fixedWindowRefund,
			debit: fixedWindowDebit, credit: fixedWindowCredit,
		},
		SlidingLog: {
			Kind: SlidingLog, Name: NameSlidingLog, Takes: FieldBlock | FieldForgetAfter, Supports: every | FeatureDebt,
			decide: slidingLog, refund: slidingLogRefund, compile: compileSlidingLog,
			debit: slidingLogDebit, credit: slidingLogCredit,
		},
		SlidingWindow: {
			Kind: SlidingWindow, Name: NameSlidingWindow, Takes: FieldBlock | FieldForgetAfter | FieldBuckets | FieldLease, Supports: every | FeatureDebt,
			decide: slidingWindow, refund: slidingWindowRefund, compile: compileSlidingWindow,
			debit: slidingWindowDebit, credit: slidingWindowCredit,
		},
		TokenBucket: {
			Kind: TokenBucket, Name: NameTokenBucket, Takes: FieldBurst | FieldBlock | FieldForgetAfter | FieldWarmup, Supports: every | FeatureDebt, Bucket: true,
			decide: tokenBucket, refund: tokenBucketRefund, compile: compileBucket,
			debit: tokenBucketDebit, credit: tokenBucketCredit,
		},
		LeakyBucket: {
			Kind: LeakyBucket, Name: NameLeakyBucket, Takes: FieldBurst | FieldBlock | FieldForgetAfter | FieldMaxDelay | FieldDelayAfter,
			Supports: every | featureShaping | FeatureDebt, Bucket: true,
			decide: leakyBucket, refund: leakyBucketRefund, compile: compileLeakyBucket, life: leakyBucketLife,
			debit: leakyBucketDebit, credit: leakyBucketCredit,
		},
		GCRA: {
			Kind: GCRA, Name: NameGCRA, Takes: FieldBurst | FieldBlock | FieldForgetAfter | FieldWarmup, Supports: every | FeatureDebt, Bucket: true,
			decide: gcra, refund: gcraRefund, compile: compileBucket, life: gcraLife,
			debit: gcraDebit, credit: gcraCredit,
		},
		Concurrency: {
			Kind: Concurrency, Name: NameConcurrency, Takes: FieldBlock | FieldForgetAfter, Supports: every | FeatureLeases,
			decide: concurrency, refund: concurrencyRefund,
		},
	}
}

// Specs returns the table: every algorithm's row, in Kind order.
func Specs() []Spec {
	return append([]Spec(nil), specs[1:]...)
}

// Spec returns k's row of the table, and whether k is an algorithm.
func (k Kind) Spec() (Spec, bool) {
	if k == 0 || int(k) >= len(specs) {
		return Spec{}, false
	}
	return specs[k], true
}

// Supports reports whether algorithm k supports every feature in f.
func (k Kind) Supports(f Feature) bool {
	s, ok := k.Spec()
	return ok && s.Supports&f == f
}

// Kinds lists every algorithm in a stable order.
func Kinds() []Kind {
	out := make([]Kind, 0, len(specs)-1)
	for _, s := range specs[1:] {
		out = append(out, s.Kind)
	}
	return out
}

// Names lists every algorithm's name, in the order of Kinds.
func Names() []string {
	out := make([]string, 0, len(specs)-1)
	for _, s := range specs[1:] {
		out = append(out, s.Name)
	}
	return out
}

// Taking lists the names of the algorithms that take field f, in the
// order of Kinds.
func Taking(f Field) []string {
	var out []string
	for _, s := range specs[1:] {
		if s.Takes&f == f {
			out = append(out, s.Name)
		}
	}
	return out
}

// Supporting lists the names of the algorithms that support every feature
// in f, in the order of Kinds.
func Supporting(f Feature) []string {
	var out []string
	for _, s := range specs[1:] {
		if s.Supports&f == f {
			out = append(out, s.Name)
		}
	}
	return out
}

// JoinNames joins names for a message: "a, b and c" (with conj "and").
func JoinNames(names []string, conj string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// String returns the algorithm's configuration name, such as "token_bucket".
func (k Kind) String() string {
	if s, ok := k.Spec(); ok {
		return s.Name
	}
	return fmt.Sprintf("algorithm(%d)", uint8(k))
}

// ParseKind returns the Kind named s, such as "gcra".
func ParseKind(s string) (Kind, bool) {
	for i := 1; i < len(specs); i++ {
		if specs[i].Name == s {
			return Kind(i), true
		}
	}
	return 0, false
}

// Problem says why Compile rejects a setting.
type Problem uint8

// The problems.
const (
	// Invalid: the value is unusable (negative, too large to be exact...);
	// the message says why.
	Invalid Problem = iota
	// NotTaken: the algorithm does not take this setting.
	NotTaken
	// OutOfRange: the value is outside the setting's fixed bounds (buckets).
	OutOfRange
	// NoSplit: the buckets do not split the period into whole microseconds.
	NoSplit
	// NeedsOther: the setting needs another one (delay_after needs max_delay).
	NeedsOther
)

// FieldError is the error of Compile: which setting of which algorithm it
// rejects, why, and the value, so that a configuration can point at the
// key that holds it.
type FieldError struct {
	Kind    Kind
	Field   Field // one field
	Problem Problem
	Value   int64 // the setting's value, in µs for durations
	msg     string
}

// Error implements error.
func (e *FieldError) Error() string { return e.msg }

func fieldError(k Kind, f Field, pr Problem, v int64, format string, args ...any) *FieldError {
	return &FieldError{Kind: k, Field: f, Problem: pr, Value: v, msg: fmt.Sprintf(format, args...)}
}

// optional are the settings an algorithm may not take, in the order
// Compile checks them, with the words its message uses for each.
var optional = [...]struct {
	f     Field
	words string
}{
	{FieldBurst, "burst applies"},
	{FieldBlock, "block applies"},
	{FieldMaxDelay | FieldDelayAfter, "max delay and delay-after apply"},
	{FieldBuckets, "buckets apply"},
	{FieldCalendar, "calendar periods (/day with a time zone, /week, /month) apply"},
	{FieldTimezone, "timezone applies"},
	{FieldResetAt, "reset_at applies"},
	{FieldWarmup, "warmup applies"},
}

// given returns the optional settings c sets.
func (c *Config) given() Field {
	var f Field
	for _, o := range [...]struct {
		f Field
		v int64
	}{{FieldBurst, c.Burst}, {FieldBlock, c.Block}, {FieldMaxDelay, c.MaxDelay}, {FieldDelayAfter, c.DelayAfter}, {FieldBuckets, c.Buckets},
		{FieldCalendar, int64(c.Calendar)}, {FieldTimezone, boolInt(c.Location != nil)}, {FieldResetAt, c.ResetAt}, {FieldWarmup, c.Warmup}} {
		if o.v != 0 {
			f |= o.f
		}
	}
	return f
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// value returns c's value of the one field f.
func (c *Config) value(f Field) int64 {
	switch f {
	case FieldRate:
		return c.Rate
	case FieldPeriod:
		return c.Period
	case FieldBurst:
		return c.Burst
	case FieldBlock:
		return c.Block
	case FieldMaxDelay:
		return c.MaxDelay
	case FieldDelayAfter:
		return c.DelayAfter
	case FieldBuckets:
		return c.Buckets
	case FieldForgetAfter:
		return c.ForgetAfter
	case FieldCalendar:
		return int64(c.Calendar)
	case FieldResetAt:
		return c.ResetAt
	case FieldWarmup:
		return c.Warmup
	}
	return int64(c.Kind)
}

// Compile validates c and derives the constants its algorithm needs. Its
// error is a *FieldError naming the setting at fault.
func Compile(c Config) (Params, error) {
	p := Params{Config: c}
	spec, ok := c.Kind.Spec()
	if !ok {
		return p, fieldError(c.Kind, FieldAlgorithm, Invalid, int64(c.Kind), "unknown algorithm %d", c.Kind)
	}
	k := c.Kind
	if c.Rate <= 0 {
		return p, fieldError(k, FieldRate, Invalid, c.Rate, "rate must be positive, got %d", c.Rate)
	}
	if c.Period <= 0 {
		return p, fieldError(k, FieldPeriod, Invalid, c.Period, "period must be at least 1µs, got %dµs", c.Period)
	}
	if c.Burst < 0 {
		return p, fieldError(k, FieldBurst, Invalid, c.Burst, "burst must not be negative, got %d", c.Burst)
	}
	if c.Block < 0 {
		return p, fieldError(k, FieldBlock, Invalid, c.Block, "block must not be negative, got %dµs", c.Block)
	}
	if c.MaxDelay < 0 || c.DelayAfter < 0 {
		f := FieldMaxDelay
		if c.MaxDelay >= 0 {
			f = FieldDelayAfter
		}
		return p, fieldError(k, f, Invalid, c.value(f), "max delay and delay-after must not be negative, got %dµs and %d", c.MaxDelay, c.DelayAfter)
	}
	if c.Rate >= MaxExact {
		return p, fieldError(k, FieldRate, Invalid, c.Rate, "rate must be below 2^53")
	}
	// Window arithmetic adds a few periods to the epoch time; ten years
	// keeps every sum exact in a Lua number.
	for _, f := range [...]Field{FieldPeriod, FieldBlock, FieldMaxDelay} {
		if c.value(f) > MaxPeriod {
			return p, fieldError(k, f, Invalid, c.value(f), "period, block and max delay must be at most 10 years, got %dµs, %dµs and %dµs", c.Period, c.Block, c.MaxDelay)
		}
	}
	given := c.given()
	for _, o := range optional {
		if bad := given & o.f &^ spec.Takes; bad != 0 {
			f := bad & -bad // the first of a pair, as the message names both
			if o.f == FieldMaxDelay|FieldDelayAfter && c.MaxDelay == 0 {
				f = FieldDelayAfter
			}
			return p, fieldError(k, f, NotTaken, c.value(f), "%s to %s, not %s", o.words, JoinNames(Taking(f), "and"), k)
		}
	}
	if c.Buckets != 0 && (c.Buckets < MinBuckets || c.Buckets > MaxBuckets) {
		return p, fieldError(k, FieldBuckets, OutOfRange, c.Buckets, "buckets must be %d to %d, got %d", MinBuckets, MaxBuckets, c.Buckets)
	}
	p.Cap = c.Rate
	p.MaxWait = c.Period
	if err := compilePenalty(&p); err != nil {
		return p, err
	}
	if err := compileCalendar(&p); err != nil {
		return p, err
	}
	if spec.compile != nil {
		if err := spec.compile(&p); err != nil {
			return p, err
		}
	}
	if err := compileWarmup(&p); err != nil {
		return p, err
	}
	return p, nil
}

// compileSlidingLog bounds the log's memory.
func compileSlidingLog(p *Params) error {
	if p.Rate > maxLogSize {
		return fieldError(p.Kind, FieldRate, Invalid, p.Rate, "%s keeps one entry per event; rate %d is over its maximum %d (use %s)", p.Kind, p.Rate, maxLogSize, SlidingWindow)
	}
	return nil
}

// compileSlidingWindow picks the tick: the smallest power of ten that
// divides every bucket (the whole period without buckets) and keeps
// Rate × Period/Tick exact.
func compileSlidingWindow(p *Params) error {
	nb := max(p.Buckets, 1)
	if p.Period%nb != 0 {
		return fieldError(p.Kind, FieldBuckets, NoSplit, p.Buckets, "%s: a %dµs period does not split into %d buckets of whole microseconds (pick a bucket count that divides it)", p.Kind, p.Period, p.Buckets)
	}
	for t := int64(1); t <= 1_000_000; t *= 10 {
		if p.Period%(t*nb) == 0 && p.Rate <= (MaxExact-1)/(p.Period/t) {
			p.Tick = t
			break
		}
	}
	if p.Tick == 0 {
		return fieldError(p.Kind, FieldRate, Invalid, p.Rate, "%s: rate %d over a %dµs period is too large to weigh exactly (lower the rate or use a whole-second period)", p.Kind, p.Rate, p.Period)
	}
	// The newest window's (or bucket's) count weighs until a period after
	// it ends.
	p.MaxWait = p.Period + p.Period/nb
	return nil
}

// compileBucket derives a bucket's units: with g = gcd(Period, Rate), one
// event is A = Period/g units and the bucket drains (or refills) B =
// Rate/g units per µs.
func compileBucket(p *Params) error {
	if p.Burst == 0 {
		p.Burst = p.Rate
	}
	p.Cap = p.Burst
	g := gcd(p.Period, p.Rate)
	p.A, p.B = p.Period/g, p.Rate/g
	if p.Burst > (MaxExact-1)/p.A {
		return fieldError(p.Kind, FieldBurst, Invalid, p.Burst, "%s: burst %d × interval %d/%dµs is too large to track exactly (lower the burst, or pick a rate that divides the period)", p.Kind, p.Burst, p.A, p.B)
	}
	p.MaxWait = ceilDiv(p.Burst*p.A, p.B) // a full refill, or drain
	return nil
}

// compileLeakyBucket is compileBucket plus shaping's settings.
func compileLeakyBucket(p *Params) error {
	if err := compileBucket(p); err != nil {
		return err
	}
	if p.MaxDelay == 0 {
		if p.DelayAfter != 0 {
			return fieldError(p.Kind, FieldDelayAfter, NeedsOther, p.DelayAfter, "%s: delay-after needs a max delay (shaping)", p.Kind)
		}
		return nil
	}
	if p.DelayAfter == 0 {
		p.DelayAfter = 1
	}
	if p.DelayAfter > p.Burst {
		return fieldError(p.Kind, FieldDelayAfter, Invalid, p.DelayAfter, "%s: delay-after %d exceeds the burst %d", p.Kind, p.DelayAfter, p.Burst)
	}
	// A delay longer than draining a full bucket can never happen.
	if full := ceilDiv(p.Burst*p.A, p.B); p.MaxDelay > full {
		p.MaxDelay = full
	}
	return nil
}

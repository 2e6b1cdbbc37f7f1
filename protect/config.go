package protect

import (
	"fmt"
	"time"
)

// Config is one protect rule.
type Config struct {
	// Name identifies the rule in rejections and metrics. Required.
	Name string
	// Concurrency is a fixed limit of requests in flight; 0 for none, or
	// for an adaptive limit when Adaptive is set.
	Concurrency int
	// Adaptive learns the limit from observed latency, between
	// MinConcurrency (default 1) and MaxConcurrency (default 1000).
	Adaptive                       bool
	MinConcurrency, MaxConcurrency int
	// InitialConcurrency is where the adaptive limit starts (default 20,
	// within the bounds).
	InitialConcurrency int
	// ProbeInterval is how often the adaptive limit halves for a moment to
	// re-measure the unloaded latency (default 5s).
	ProbeInterval time.Duration
	// MaxWait is how long a critical request that finds the limit full
	// waits for a slot (Rule.Wait), taking the first one freed; other
	// priorities never wait. 0: under an adaptive limit, the unloaded
	// latency the limit measured (Rule.MaxWait); otherwise no wait.
	MaxWait time.Duration
	// Reserve is the share of the limit, in [0, 1), that only critical
	// requests may use.
	Reserve float64
	// Breaker, if set, adds a circuit breaker.
	Breaker *BreakerConfig
	// MaxCPU, between 0 and 1 (0 off), is the process's CPU use, as a share
	// of GOMAXPROCS, above which requests are admitted only while in flight
	// stays under the measured throughput × minimum latency. CPU reads the
	// process's CPU time (default: the operating system's count, where
	// there is one).
	MaxCPU float64
	CPU    func() time.Duration
	// Shadow counts and reports what the rule would shed, and sheds
	// nothing.
	Shadow bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// BreakerConfig configures a circuit breaker. Each strategy is on when its
// threshold is set, and any of them trips the breaker once the window has
// seen at least MinRequests outcomes.
type BreakerConfig struct {
	// SlowCall is the latency above which a call is slow; with SlowRatio
	// (in (0, 1]), the breaker opens when that share of calls is slow.
	SlowCall  time.Duration
	SlowRatio float64
	// ErrorRatio, in (0, 1], opens the breaker when that share of calls
	// failed (a 5xx, a panic or a transport error).
	ErrorRatio float64
	// Errors, when positive, opens the breaker at that many failures.
	Errors int
	// MinRequests is how many outcomes the window needs before any
	// strategy may trip (default 5).
	MinRequests int
	// Window is the span the outcomes are counted over, in ten buckets
	// (default 10s).
	Window time.Duration
	// OpenFor is how long an open breaker refuses calls before letting
	// probes through (default 10s).
	OpenFor time.Duration
	// Probes is how many calls a half-open breaker lets through; when all
	// succeed it closes, and any failure or slow call opens it again
	// (default 1).
	Probes int
}

// Defaults of the configs' zero fields.
const (
	DefaultMaxConcurrency     = 1000
	DefaultInitialConcurrency = 20
	DefaultProbeInterval      = 5 * time.Second
	DefaultMinRequests        = 5
	DefaultWindow             = 10 * time.Second
	DefaultOpenFor            = 10 * time.Second
)

// ConfigProblem is one thing wrong with a Config: Field names it as weir.yaml
// spells it, such as "reserve" or "breaker.slow_ratio".
type ConfigProblem struct {
	Field, Message string
}

// Problems validates c and lists what is wrong; none means New accepts it.
func (c *Config) Problems() []ConfigProblem {
	var ps []ConfigProblem
	add := func(f, format string, a ...any) { ps = append(ps, ConfigProblem{f, fmt.Sprintf(format, a...)}) }
	if c.Name == "" {
		add("name", "a protect rule needs a name")
	}
	if c.Concurrency < 0 {
		add("concurrency", "concurrency must be adaptive or a number of requests in flight of at least 1, got %d", c.Concurrency)
	}
	if c.Adaptive && c.Concurrency > 0 {
		add("concurrency", "concurrency is either adaptive or a fixed number, not both")
	}
	if c.MinConcurrency < 0 {
		add("min_concurrency", "min_concurrency must be at least 1, got %d", c.MinConcurrency)
	}
	if c.MaxConcurrency < 0 {
		add("max_concurrency", "max_concurrency must be at least 1, got %d", c.MaxConcurrency)
	}
	if !c.Adaptive && (c.MinConcurrency != 0 || c.MaxConcurrency != 0) {
		add("max_concurrency", "min_concurrency and max_concurrency bound concurrency: adaptive only")
	}
	if lo, hi := c.bounds(); c.Adaptive && lo > hi {
		add("min_concurrency", "min_concurrency %d is above max_concurrency %d", lo, hi)
	}
	if c.ProbeInterval < 0 {
		add("probe_interval", "probe_interval must not be negative, got %s", c.ProbeInterval)
	}
	if c.MaxWait < 0 {
		add("max_wait", "max_wait must not be negative, got %s", c.MaxWait)
	}
	if !(c.Reserve >= 0 && c.Reserve < 1) {
		add("reserve", "reserve must be at least 0%% and below 100%%, got %g%%", c.Reserve*100)
	}
	if c.Reserve > 0 && !c.Adaptive && c.Concurrency == 0 && c.MaxCPU == 0 {
		add("reserve", "reserve is a share of the concurrency limit, and the rule has none")
	}
	if !(c.MaxCPU >= 0 && c.MaxCPU <= 1) {
		add("max_cpu", "max_cpu must be above 0%% and at most 100%%, got %g%%", c.MaxCPU*100)
	}
	if b := c.Breaker; b != nil {
		ps = append(ps, b.problems()...)
	}
	if !c.Adaptive && c.Concurrency == 0 && c.Breaker == nil && c.MaxCPU == 0 {
		add("concurrency", "a protect rule needs concurrency or a breaker")
	}
	return ps
}

func (b *BreakerConfig) problems() []ConfigProblem {
	var ps []ConfigProblem
	add := func(f, format string, a ...any) {
		ps = append(ps, ConfigProblem{"breaker." + f, fmt.Sprintf(format, a...)})
	}
	ratio := func(f string, v float64) {
		if !(v >= 0 && v <= 1) {
			add(f, "%s must be between 0 and 1, got %g", f, v)
		}
	}
	ratio("slow_ratio", b.SlowRatio)
	ratio("error_ratio", b.ErrorRatio)
	for _, d := range []struct {
		f string
		v time.Duration
	}{{"slow_call", b.SlowCall}, {"window", b.Window}, {"open_for", b.OpenFor}} {
		if d.v < 0 {
			add(d.f, "%s must not be negative, got %s", d.f, d.v)
		}
	}
	if b.Errors < 0 {
		add("errors", "errors must not be negative, got %d", b.Errors)
	}
	if b.MinRequests < 0 {
		add("min_requests", "min_requests must not be negative, got %d", b.MinRequests)
	}
	if b.Probes < 0 {
		add("probes", "probes must not be negative, got %d", b.Probes)
	}
	const together = "slow_call and slow_ratio go together: a call slower than slow_call is slow, and slow_ratio of them opens the breaker"
	switch {
	case b.SlowRatio > 0 && b.SlowCall == 0:
		add("slow_call", together)
	case b.SlowCall > 0 && b.SlowRatio == 0:
		add("slow_ratio", together)
	}
	if b.SlowRatio == 0 && b.ErrorRatio == 0 && b.Errors == 0 {
		add("errors", "a breaker needs a strategy: slow_call with slow_ratio, error_ratio, or errors")
	}
	return ps
}

// bounds returns the adaptive limit's floor and ceiling.
func (c *Config) bounds() (lo, hi int) {
	lo, hi = max(c.MinConcurrency, 1), c.MaxConcurrency
	if hi == 0 {
		hi = max(DefaultMaxConcurrency, lo)
	}
	return lo, hi
}

// withDefaults returns b with its zero fields defaulted.
func (b BreakerConfig) withDefaults() BreakerConfig {
	if b.MinRequests == 0 {
		b.MinRequests = DefaultMinRequests
	}
	if b.Window == 0 {
		b.Window = DefaultWindow
	}
	if b.OpenFor == 0 {
		b.OpenFor = DefaultOpenFor
	}
	if b.Probes == 0 {
		b.Probes = 1
	}
	return b
}

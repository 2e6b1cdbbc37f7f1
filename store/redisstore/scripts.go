package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/weir-dev/weir/algorithm"
)

// The Lua sources. Each algorithm's math lives in one file, and the
// drivers (take.lua, multi.lua, release.lua) each define one Lua function
// of (KEYS, ARGV), so that the same code runs in both forms Redis offers:
//
//   - the library: one Redis Functions library holding the prelude, every
//     algorithm and the three drivers, loaded once with FUNCTION LOAD and
//     called with FCALL. Redis builds the prelude's closures and tables when
//     it loads the library, not on every call, which saves about 15% of
//     its work per decision (docs/benchmarks.md has the figures).
//   - EVAL scripts: the same files plus a line that calls the driver with
//     the KEYS and ARGV globals, for a Redis without Functions (before 7.0)
//     or an ACL that forbids FUNCTION LOAD. A take script carries only its
//     own algorithm.
//
//go:embed scripts/*.lua
var scriptFiles embed.FS

// script is one assembled EVAL script and its SHA-1, the name EVALSHA uses.
type script struct {
	src string
	sha string
}

// source concatenates the named files.
func source(files ...string) string {
	var b strings.Builder
	for _, f := range files {
		src, err := scriptFiles.ReadFile("scripts/" + f + ".lua")
		if err != nil {
			panic("redisstore: missing embedded script " + f + ".lua")
		}
		b.WriteString("-- ===== " + f + ".lua =====\n")
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}

// newScript builds an EVAL script from files, ending in a call of the Lua
// function driver with the script's KEYS and ARGV.
func newScript(driver string, files ...string) *script {
	src := source(files...) + "return " + driver + "(KEYS, ARGV)\n"
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// routine is one of weir's entry points into Redis, in both forms: the
// library function fn, and the equivalent EVAL script.
type routine struct {
	fn     string
	script *script
}

// lib is the Functions library. Its name, and so its functions' names,
// carry a hash of its code ("weir_<12 hex digits>"): two weir versions
// sharing a Redis during a rolling upgrade each call their own code, and
// loading a library that is already there is a no-op.
var lib struct {
	name string
	src  string
}

var (
	// takeRoutines[k] decides one request under algorithm k (index 0 is
	// no algorithm).
	takeRoutines []routine
	// eventRoutines[k] decides one request under algorithm k and records
	// its events (events.lua).
	eventRoutines []routine
	// batchRoutine decides the independent requests of many callers.
	batchRoutine routine
	// nodeBatchFn is the library function that decides the requests of
	// many callers whose keys one Redis Cluster node serves, in several
	// slots. It has no EVAL form: without Functions, a Cluster store sends
	// each decision alone.
	nodeBatchFn string
	// multiRoutine decides a batch all or nothing, and refunds one.
	multiRoutine routine
	// releaseRoutine gives a concurrency lease back.
	releaseRoutine routine
)

func init() {
	// Each algorithm's Lua file is named after it: scripts/<name>.lua.
	all := []string{"prelude"}
	for _, k := range algorithm.Kinds() {
		all = append(all, k.String())
	}
	all = append(all, "warmup") // wraps the buckets' functions
	body := source(append(all, "take", "events", "batch", "multi", "release")...)
	sum := sha1.Sum([]byte(body))
	lib.name = "weir_" + hex.EncodeToString(sum[:6])
	fn := func(driver string) string { return lib.name + "_" + driver }
	var reg strings.Builder
	for _, d := range []string{"take", "take_events", "batch", "multi", "release"} {
		fmt.Fprintf(&reg, "redis.register_function('%s', weir_%s)\n", fn(d), d)
	}
	// limits reports the size of the library's parsed-limit cache (tests).
	fmt.Fprintf(&reg, "redis.register_function{function_name='%s', callback=weir_limits, flags={'no-writes'}}\n", fn("limits"))
	// nbatch touches keys of several slots of one Cluster node (batch.lua).
	fmt.Fprintf(&reg, "redis.register_function{function_name='%s', callback=weir_nbatch, flags={'allow-cross-slot-keys'}}\n", fn("nbatch"))
	lib.src = "#!lua name=" + lib.name + "\n" + body + reg.String()

	takeRoutines = make([]routine, len(all))
	eventRoutines = make([]routine, len(all))
	for _, k := range algorithm.Kinds() {
		takeRoutines[k] = routine{fn: fn("take"), script: newScript("weir_take", "prelude", k.String(), "warmup", "take")}
		eventRoutines[k] = routine{fn: fn("take_events"), script: newScript("weir_take_events", "prelude", k.String(), "warmup", "take", "events")}
	}
	nodeBatchFn = fn("nbatch")
	batchRoutine = routine{fn: fn("batch"), script: newScript("weir_batch", append(all, "batch")...)}
	multiRoutine = routine{fn: fn("multi"), script: newScript("weir_multi", append(all, "events", "multi")...)}
	releaseRoutine = routine{fn: fn("release"), script: newScript("weir_release", "prelude", algorithm.Concurrency.String(), "release")}
}

// limitArg renders p as the scripts' limit_of reads it: params()'s values
// in order, each followed by '|' but the last (extArgs, which holds no
// '|'). Every derived constant is Compile's; the scripts never recompute
// one. The library keeps what it parsed of the string between calls,
// keyed by the string itself, so a limit costs its parse once.
func limitArg(p *algorithm.Params) string {
	shaping := "0"
	if p.Shaping() {
		shaping = "1"
	}
	outlasts := "0"
	if p.BoxOutlasts() {
		outlasts = "1"
	}
	f := func(v int64) string { return strconv.FormatInt(v, 10) }
	// As many fields as prelude.lua's NLIMIT.
	return strings.Join([]string{
		p.Kind.String(), f(p.Rate), f(p.Period), f(p.Burst), f(p.Block),
		f(p.MaxDelay), f(p.DelayAfter), f(p.Cap), f(p.A), f(p.B), f(p.Tick), shaping, outlasts,
		f(p.Buckets), extArgs(p),
	}, "|")
}

// extArgs renders the settings most limits leave unset, as the packed
// limit's last field, which prelude.lua's params_ext reads: ';'-separated "<letter>=<values>",
// the values ','-separated integers; "" when none is set.
//
//	e=<forget_after>,<box 2>,<box 3>...   an escalating penalty
//	w=<warmup>,<step>                      a warm-up (warmup.lua)
//	c=<b0>,<b1>,<b2>,<b3>                  a calendar window's bounds, per call (calendar.go)
func extArgs(p *algorithm.Params) string {
	var b strings.Builder
	if p.Warming() {
		fmt.Fprintf(&b, "w=%d,%d", p.Warmup, p.Warmup/algorithm.WarmupSteps)
	}
	if p.Escalating() {
		if b.Len() > 0 {
			b.WriteByte(';')
		}
		b.WriteString("e=")
		b.WriteString(strconv.FormatInt(p.ForgetAfter, 10))
		for _, box := range p.Escalate {
			if box == 0 {
				break
			}
			b.WriteByte(',')
			b.WriteString(strconv.FormatInt(box, 10))
		}
	}
	return b.String()
}

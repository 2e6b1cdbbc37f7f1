package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/weir-dev/weir/algorithm"
)

// The Lua sources. Each algorithm's math lives in one file; scripts are
// assembled from them at init so that the per-algorithm take script and the
// multi-key script run the same code.
//
//go:embed scripts/*.lua
var scriptFiles embed.FS

// script is one assembled Lua script and its SHA-1, the name EVALSHA uses.
type script struct {
	name string
	src  string
	sha  string
}

func newScript(name string, files ...string) *script {
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
	src := b.String()
	sum := sha1.Sum([]byte(src))
	return &script{name: name, src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	// takeScripts[k] decides one request under algorithm k:
	// prelude + <algorithm>.lua + take.lua.
	takeScripts [len(kindNames)]*script
	// multiScript decides a batch all or nothing, and refunds one:
	// prelude + every algorithm + multi.lua.
	multiScript *script
	// releaseScript gives a concurrency lease back.
	releaseScript *script
)

// kindNames indexes algorithm names by algorithm.Kind.
var kindNames = [...]string{"", "fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra", "concurrency"}

func init() {
	all := []string{"prelude"}
	for _, k := range algorithm.Kinds() {
		if kindNames[k] != k.String() {
			panic("redisstore: kindNames out of step with package algorithm")
		}
		takeScripts[k] = newScript(k.String(), "prelude", k.String(), "take")
		all = append(all, k.String())
	}
	multiScript = newScript("multi", append(all, "multi")...)
	releaseScript = newScript("release", "release")
}

// nLimitArgs is the number of ARGV values a compiled limit takes.
const nLimitArgs = 13

// limitArgs renders p as the scripts' params() reads it. Every derived
// constant is Compile's; the scripts never recompute one.
func limitArgs(p *algorithm.Params) [nLimitArgs]string {
	shaping := "0"
	if p.Shaping() {
		shaping = "1"
	}
	outlasts := "0"
	if p.BoxOutlasts() {
		outlasts = "1"
	}
	f := func(v int64) string { return strconv.FormatInt(v, 10) }
	return [nLimitArgs]string{
		p.Kind.String(), f(p.Rate), f(p.Period), f(p.Burst), f(p.Block),
		f(p.MaxDelay), f(p.DelayAfter), f(p.Cap), f(p.A), f(p.B), f(p.Tick), shaping, outlasts,
	}
}

package policy

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/weir-dev/weir"
)

// DefaultNearLimit is the near_limit share in force when the config sets
// none: 80%, as envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimit = 0.8

// NearLimit reports whether res, a decision, admitted and counted events
// (a peek or a rejection never does) and left its key at or past ratio of
// its limit: (Limit-Remaining)/Limit ≥ ratio. A ratio of 0 or less is off.
// It compares exactly, in parts per million, without allocating.
func NearLimit(res weir.Result, ratio float64) bool {
	if ratio <= 0 || !res.Allowed || res.Granted <= 0 || res.Limit <= 0 {
		return false
	}
	used := res.Limit - res.Remaining
	if used <= 0 {
		return false
	}
	ppm := uint64(math.Round(min(ratio, 1) * 1e6))
	uh, ul := bits.Mul64(uint64(used), 1e6)
	th, tl := bits.Mul64(ppm, uint64(res.Limit))
	return uh > th || uh == th && ul >= tl
}

// NearLimit returns the global near_limit share (0.8 for 80%), 0 when off.
// The Envoy service's rules use it.
func (p *Policy) NearLimit() float64 { return p.c.nearLimit }

// parseNearLimit reads a near_limit value: "80%", "0.8", "off" or 0 (off);
// empty is def. ok is false when s is none of these.
func parseNearLimit(s string, def float64) (v float64, ok bool) {
	s = strings.TrimSpace(s)
	switch s {
	case "":
		return def, true
	case "off":
		return 0, true
	}
	num, pct := strings.CutSuffix(s, "%")
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	if pct {
		f /= 100
	}
	if f < 0 || f > 1 {
		return 0, false
	}
	return f, true
}

func nearLimitMsg(s string) string {
	return fmt.Sprintf("near_limit %s must be a share of the limit such as 80%% or 0.8 (above 0, at most 100%%), or off", quote(s))
}

// checkNearLimit parses the near_limit at path, reporting a bad value.
func checkNearLimit(path, s string, def float64, rep reporter) float64 {
	v, ok := parseNearLimit(s, def)
	if !ok {
		rep.addAt(path, nearLimitMsg(s))
	}
	return v
}

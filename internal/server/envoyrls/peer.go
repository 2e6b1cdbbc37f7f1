package envoyrls

import "github.com/weir-dev/weir"

// peerMode says how a descriptor under a plain fixed window is asked of
// the store so that it counts as envoyproxy/ratelimit counts it. Upstream
// adds every call's hits to the window's counter and answers OVER_LIMIT
// when the counter is then over requests_per_unit. weir keeps its take
// (a rejected request consumes nothing) for calls without their own
// hits_addend, and follows upstream for the two calls a cost flow makes:
//   - peerCheck: hits_addend 0, the request-path check, passes while the
//     counter is at most the limit (a spent budget still passes; one
//     overrun does not);
//   - peerCount: a descriptor's own hits_addend above 0, the
//     response-path charge of tokens, always counts in full, past the
//     limit if need be, so that the next check is refused.
type peerMode uint8

const (
	peerTake peerMode = iota
	peerCheck
	peerCount
)

// countRate is the rate a peerCount charge is taken under: the largest a
// limit may have, so that the charge always fits and is counted in the
// window's own counter, past the rule's rate.
const countRate = 1<<53 - 1

// peerModeOf says how the store is asked about item it of rule r.
func peerModeOf(r *rule, it *item) peerMode {
	l := r.limit
	if l.Algorithm != weir.FixedWindow || l.Burst != 0 || l.Block != 0 {
		return peerTake // weir's own algorithms keep weir's semantics
	}
	switch {
	case it.hits == 0:
		return peerCheck
	case it.explicit:
		return peerCount
	}
	return peerTake
}

// peerRequest is the store request of item it under r for its peerMode.
// A fixed window's counter caps at the rate of the limit it is read under
// (a lowered limit), so a check under rate+1 admits a cost of 1 exactly
// when the counter is at most rate, and a charge under countRate is
// counted whatever the rule's rate.
func peerRequest(key string, r *rule, it *item) weir.Request {
	l := r.limit
	if it.peer == peerCheck {
		l.Rate++
		return weir.Request{Key: key, Limit: l}
	}
	l.Rate = countRate
	return weir.Request{Key: key, Limit: l, N: min(it.hits, countRate)}
}

// peerResult turns the store's answer to a peerRequest into the answer
// under the rule's own rate: Allowed when the counter is at most the
// rate, Remaining what is left of it.
func peerResult(r *rule, it *item, res *weir.Result) {
	rate := r.limit.Rate
	switch it.peer {
	case peerCheck:
		// Under rate+1: Remaining is rate+1-counter while allowed.
		res.Limit = rate
		res.Remaining = max(res.Remaining-1, 0)
		if !res.Allowed {
			res.Remaining = 0
		}
	case peerCount:
		count := countRate - res.Remaining
		res.Limit = rate
		res.Allowed = count <= rate
		res.Remaining = max(rate-count, 0)
		if !res.Allowed {
			res.Remaining = 0
		}
		res.Granted = min(it.hits, countRate)
		res.RetryAfter = 0
		if !res.Allowed {
			res.RetryAfter = res.ResetAfter
		}
	}
}

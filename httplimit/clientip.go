package httplimit

import (
	"github.com/weir-dev/weir"
	"net/http"
	"net/netip"

	"github.com/weir-dev/weir/policy"
)

// ipKey is the key KeyByIP gives: the client IP as policy.ClientIP finds
// it, so that New and policy rules with identity ip agree on who a client
// is. A request whose RemoteAddr holds no address (a Unix socket, say) is
// keyed by RemoteAddr as it is.
func ipKey(r *http.Request, trusted []netip.Prefix) string {
	if a := policy.ClientIP(r, trusted); a.IsValid() {
		return a.String()
	}
	return r.RemoteAddr
}

// ipIdentity returns the client-IP identity of r and its store key under
// rule in one allocation for IPv4: the address is written to the stack and
// escaped straight into the key, whose tail is then the identity (escaping
// leaves an IPv4 address as it is).
func ipIdentity(r *http.Request, trusted []netip.Prefix, rule string) (id, key string) {
	a := policy.ClientIP(r, trusted)
	if !a.IsValid() {
		return r.RemoteAddr, weir.Key(rule, r.RemoteAddr)
	}
	var b [64]byte
	t := a.AppendTo(b[:0])
	key = weir.Key(rule, string(t))
	if n := len(key) - len(t); n > 0 && key[n:] == string(t) {
		return key[n:], key
	}
	return string(t), key
}

package httplimit

import (
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

package httplimit

import (
	"net/http"
	"net/netip"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
)

// ipKeyer finds the client-IP key of a request: the client IP as
// clientip.From finds it, grouped by prefix, so that New and policy rules
// with identity ip agree on who a client is.
type ipKeyer struct {
	trusted      []netip.Prefix // the proxies whose headers are believed
	header       string         // canonical, see clientip.CanonicalHeader
	bits4, bits6 int
}

func defaultIPKeyer() ipKeyer {
	return ipKeyer{header: clientip.Auto, bits4: 32, bits6: clientip.DefaultIPv6Bits}
}

// key is the key KeyByIP gives r. A request whose RemoteAddr holds no
// address (a Unix socket, say) is keyed by RemoteAddr as it is.
func (k *ipKeyer) key(r *http.Request) string {
	a := clientip.From(r, k.trusted, k.header)
	if !a.IsValid() {
		return r.RemoteAddr
	}
	var b [64]byte
	return string(k.append(b[:0], a))
}

// append appends the text of a grouped by the keyer's prefixes
// (clientip.AppendGroup).
func (k *ipKeyer) append(b []byte, a netip.Addr) []byte {
	return clientip.AppendGroup(b, a, k.bits4, k.bits6)
}

// identity returns the client-IP identity of r and its store key under
// rule in one allocation for IPv4: the address is written to the stack and
// escaped straight into the key, whose tail is then the identity (escaping
// leaves an IPv4 address or prefix as it is).
func (k *ipKeyer) identity(r *http.Request, rule string) (id, key string) {
	a := clientip.From(r, k.trusted, k.header)
	if !a.IsValid() {
		return r.RemoteAddr, weir.Key(rule, r.RemoteAddr)
	}
	var b [64]byte
	t := k.append(b[:0], a)
	key = weir.Key(rule, string(t))
	if n := len(key) - len(t); n > 0 && key[n:] == string(t) {
		return key[n:], key
	}
	return string(t), key
}

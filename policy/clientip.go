package policy

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/weir-dev/weir/clientip"
)

// Client address headers: the values of client_ip_header (Config.ClientIPHeader)
// and of ClientIPFrom's header that have a meaning of their own (package
// clientip defines them). Any other value names a header that holds the
// client address, such as CF-Connecting-IP or True-Client-IP.
const (
	// ClientIPAuto reads X-Real-IP when the trusted proxy sent one that
	// is not itself a trusted address, and walks X-Forwarded-For
	// otherwise. It is the default.
	ClientIPAuto = clientip.Auto
	// ClientIPForwardedFor walks X-Forwarded-For from the right, skipping
	// trusted hops, and ignores X-Real-IP: for chains of proxies that each
	// append to X-Forwarded-For.
	ClientIPForwardedFor = clientip.ForwardedFor
)

// ClientIP returns the address of the client that sent r, or the zero Addr
// when it cannot be told: ClientIPFrom(r, trusted, ClientIPAuto).
//
// Deprecated: use clientip.From(r, trusted, clientip.Auto).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	return clientip.From(r, trusted, clientip.Auto)
}

// CanonicalIPHeader returns the form of a client address header that
// ClientIPFrom reads fastest: clientip.CanonicalHeader.
//
// Deprecated: use clientip.CanonicalHeader.
func CanonicalIPHeader(h string) (canon string, ok bool) { return clientip.CanonicalHeader(h) }

// ClientIPFrom returns the address of the client that sent r, or the zero
// Addr when it cannot be told; header says which forwarding header carries
// the client address. It is clientip.From, whose documentation says how
// the address is found: the peer's, unless the peer is inside trusted.
//
// Deprecated: use clientip.From.
func ClientIPFrom(r *http.Request, trusted []netip.Prefix, header string) netip.Addr {
	return clientip.From(r, trusted, header)
}

// clean unmaps an IPv4-mapped address and drops any zone, as package
// clientip does with the addresses it finds.
func clean(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func inPrefixes(a netip.Addr, ps []netip.Prefix) bool { return clientip.InPrefixes(a, ps) }

// parsePrefix parses a CIDR or a bare address (a /32 or /128), refusing
// host bits set beyond the prefix, which usually means a typo.
func parsePrefix(s string) (netip.Prefix, string) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, "invalid CIDR " + quote(s) + " (want an address or address/bits, such as 10.0.0.0/8)"
		}
		a = clean(a)
		return netip.PrefixFrom(a, a.BitLen()), ""
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, "invalid CIDR " + quote(s) + " (want an address or address/bits, such as 10.0.0.0/8)"
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, "invalid CIDR " + quote(s) + ": a zone is not allowed"
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, "CIDR " + quote(s) + " has host bits set (did you mean " + m.String() + "?)"
	}
	if p.Addr().Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			return netip.Prefix{}, "CIDR " + quote(s) + " is an IPv4-mapped prefix shorter than ::ffff:0:0/96"
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), bits)
	}
	return p, ""
}

package policy

import (
	"net/netip"
	"strings"

	"github.com/weir-dev/weir/clientip"
)

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

package policy

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the address of the client that sent r, or the zero Addr
// when it cannot be told.
//
// The peer address (r.RemoteAddr) is the answer unless the peer is itself
// inside one of the trusted prefixes, that is, a proxy you run. Only then
// are forwarding headers read:
//
//   - X-Forwarded-For is walked from the right, skipping addresses inside
//     trusted; the first address that is not trusted is the client. If every
//     address is trusted, the leftmost is the client. An entry that is not an
//     address stops the walk, and the last trusted hop is the answer, since
//     nothing left of garbage can be believed.
//   - Without X-Forwarded-For, X-Real-IP is used.
//
// With no trusted prefixes the headers are never read, so a client cannot
// choose its own identity by sending them. IPv4-mapped IPv6 addresses are
// returned as IPv4, and zones are dropped.
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseHostAddr(r.RemoteAddr)
	if !peer.IsValid() || !inPrefixes(peer, trusted) {
		return peer
	}
	// The entries of every X-Forwarded-For line, in order, empty ones
	// skipped, walked from the right without splitting them into a slice.
	xff := r.Header.Values("X-Forwarded-For")
	last, seen := peer, false
	for i := len(xff) - 1; i >= 0; i-- {
		for h, more := xff[i], true; more; {
			e := h
			if j := strings.LastIndexByte(h, ','); j >= 0 {
				e, h = h[j+1:], h[:j]
			} else {
				more = false
			}
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			seen = true
			a := parseHostAddr(e)
			if !a.IsValid() {
				return last
			}
			if !inPrefixes(a, trusted) {
				return a
			}
			last = a
		}
	}
	if seen {
		return last
	}
	if real := parseHostAddr(strings.TrimSpace(r.Header.Get("X-Real-IP"))); real.IsValid() {
		return real
	}
	return peer
}

// parseHostAddr parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" or
// "[::1]", unmapping IPv4-in-IPv6 and dropping any zone. It allocates
// nothing for these forms: it only parses s as an address when s can be
// one, since a failed parse allocates its error.
func parseHostAddr(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	// An address neither starts with '[' nor has exactly one colon (an
	// IPv6 address has at least two), so such an s is host:port, or
	// "[host]".
	if s[0] != '[' && !oneColon(s) {
		if a, err := netip.ParseAddr(s); err == nil {
			return clean(a)
		}
		// Without '[' and with no or several colons, s is not host:port
		// either.
		return netip.Addr{}
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if a, err := netip.ParseAddr(host); err == nil {
			return clean(a)
		}
		return netip.Addr{}
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return clean(a)
		}
	}
	return netip.Addr{}
}

// oneColon reports whether s holds exactly one ':'.
func oneColon(s string) bool {
	i := strings.IndexByte(s, ':')
	return i >= 0 && strings.IndexByte(s[i+1:], ':') < 0
}

func clean(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func inPrefixes(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

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

// Package clientip tells who sent an HTTP request: the peer's address,
// or, when the peer is a proxy you trust, the client address it forwarded
// (X-Real-IP, X-Forwarded-For, or a header you name). Package httplimit
// keys requests by it and package policy's ip identity counts by it, so
// that both agree on who a client is.
package clientip

import (
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// DefaultIPv6Bits is the prefix length by which weir groups IPv6 clients
// (httplimit.KeyByIP, policy's ip identity): one host usually owns a whole
// /64, and could otherwise take a new key for every request. IPv4 clients
// count whole.
const DefaultIPv6Bits = 64

// Client address headers: the values of From's header (weir.yaml's
// client_ip_header) that have a meaning of their own. Any other value
// names a header that holds the client address, such as CF-Connecting-IP
// or True-Client-IP.
const (
	// Auto reads X-Real-IP when the trusted proxy sent one that
	// is not itself a trusted address, and walks X-Forwarded-For
	// otherwise. It is the default.
	Auto = "auto"
	// ForwardedFor walks X-Forwarded-For from the right, skipping
	// trusted hops, and ignores X-Real-IP: for chains of proxies that each
	// append to X-Forwarded-For.
	ForwardedFor = "X-Forwarded-For"
)

// CanonicalHeader returns the form of a client address header that From
// reads fastest: Auto for "" or "auto" (any case), else the canonical
// header name. ok is false when h is not a valid header name.
func CanonicalHeader(h string) (canon string, ok bool) {
	h = strings.TrimSpace(h)
	if h == "" || strings.EqualFold(h, Auto) {
		return Auto, true
	}
	if !IsToken(h) {
		return "", false
	}
	return textproto.CanonicalMIMEHeaderKey(h), true
}

// IsToken reports whether s is an RFC 9110 token, which header names (and
// cookie names and methods) are.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// From returns the address of the client that sent r, or the zero Addr
// when it cannot be told; header says which forwarding header carries the
// client address (see CanonicalHeader).
//
// The peer address (r.RemoteAddr) is the answer unless the peer is itself
// inside one of the trusted prefixes, that is, a proxy you run. Only then
// are forwarding headers read, as header says:
//
//   - ForwardedFor ("X-Forwarded-For"): X-Forwarded-For is walked
//     from the right, skipping addresses inside trusted; the first address
//     that is not trusted is the client. If every address is trusted, the
//     leftmost is the client. An entry that is not an address stops the
//     walk, and the last trusted hop is the answer, since nothing left of
//     garbage can be believed. Without X-Forwarded-For, the peer.
//   - any other header name, such as X-Real-IP or CF-Connecting-IP: the
//     last address in that header, which the proxy wrote; the peer when
//     the header is missing or holds no address.
//   - Auto (the default, also ""): X-Real-IP when the peer sent
//     one holding an address outside trusted; otherwise X-Forwarded-For
//     as above, and without it X-Real-IP (even a trusted one), then the
//     peer. A proxy that sets X-Real-IP (nginx: proxy_set_header X-Real-IP
//     $remote_addr) often passes the client's own X-Forwarded-For on
//     unchanged, so the address the proxy wrote must win over the one the
//     client wrote.
//
// With no trusted prefixes the headers are never read, so a client cannot
// choose its own identity by sending them. IPv4-mapped IPv6 addresses are
// returned as IPv4, and zones are dropped. header is matched without
// regard to case; From allocates nothing when it is in canonical form
// (see CanonicalHeader).
func From(r *http.Request, trusted []netip.Prefix, header string) netip.Addr {
	peer := parseHostAddr(r.RemoteAddr)
	if !peer.IsValid() || !InPrefixes(peer, trusted) {
		return peer
	}
	switch {
	case header == ForwardedFor || strings.EqualFold(header, ForwardedFor):
		if a, ok := walkXFF(r.Header["X-Forwarded-For"], trusted, peer); ok {
			return a
		}
		return peer
	case header == Auto || header == "" || strings.EqualFold(header, Auto):
		real := lastAddr(r.Header["X-Real-Ip"])
		if real.IsValid() && !InPrefixes(real, trusted) {
			return real
		}
		if a, ok := walkXFF(r.Header["X-Forwarded-For"], trusted, peer); ok {
			return a
		}
		if real.IsValid() {
			return real
		}
		return peer
	}
	vals, ok := r.Header[header]
	if !ok && header != textproto.CanonicalMIMEHeaderKey(header) {
		vals = r.Header.Values(header)
	}
	if a := lastAddr(vals); a.IsValid() {
		return a
	}
	return peer
}

// walkXFF walks the entries of every X-Forwarded-For line, in order, empty
// ones skipped, from the right without splitting them into a slice; ok is
// false when there is no entry.
func walkXFF(xff []string, trusted []netip.Prefix, peer netip.Addr) (a netip.Addr, ok bool) {
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
				return last, true
			}
			if !InPrefixes(a, trusted) {
				return a, true
			}
			last = a
		}
	}
	return last, seen
}

// lastAddr parses the last non-empty entry of a header's lines (a proxy
// that appends puts its own last); the zero Addr when it is no address.
func lastAddr(vals []string) netip.Addr {
	for i := len(vals) - 1; i >= 0; i-- {
		v := vals[i]
		if j := strings.LastIndexByte(v, ','); j >= 0 {
			v = v[j+1:]
		}
		if v = strings.TrimSpace(v); v != "" {
			return parseHostAddr(v)
		}
	}
	return netip.Addr{}
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

// clean unmaps an IPv4-mapped address and drops any zone.
func clean(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// InPrefixes reports whether a lies inside one of ps.
func InPrefixes(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// AppendGroup appends to b the text of the group of the valid address a:
// its prefix of bits4 (IPv4) or bits6 (IPv6) bits, "2001:db8::/64", or the
// bare address when the prefix is the whole of it.
func AppendGroup(b []byte, a netip.Addr, bits4, bits6 int) []byte {
	bits := bits6
	if a.Is4() {
		bits = bits4
	}
	if bits >= a.BitLen() {
		return a.AppendTo(b)
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a.AppendTo(b)
	}
	return p.AppendTo(b)
}

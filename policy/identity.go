package policy

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/internal/yamlnode"
)

// idKind is what an identity reads from a request.
type idKind uint8

const (
	idIP idKind = iota + 1
	idHeader
	idCookie
	idQuery
	idMethod
	idRoute
	idConst
	idTrustedHeader
)

// identity is one parsed identity spec such as "ip/24" or "header:X-API-Key".
type identity struct {
	spec   string // as written
	kind   idKind
	arg    string // header name (canonical), cookie or query name, const value
	bits4  int    // ip: IPv4 prefix length (32 = the whole address)
	bits6  int    // ip: IPv6 prefix length (128 = the whole address; clientip.DefaultIPv6Bits unless set)
	hasArg bool
}

// identityHelp lists the identity forms for error messages.
// identityKinds are the identities' kinds, what comes before ':'.
var identityKinds = []string{"ip", "header", "trusted_header", "cookie", "query", "method", "route", "const"}

const identityHelp = "want ip, ip/BITS, header:NAME, trusted_header:NAME, cookie:NAME, query:NAME, method, route or const:VALUE"

// parseIdentity parses an identity spec.
//
//	ip            the client IP (see clientip.From): an IPv4 client whole, an
//	              IPv6 client by its /64, the block one host owns
//	ip/24         IPv4 clients grouped by /24; IPv6 clients by /64
//	ip/48         IPv6 clients grouped by /48; IPv4 clients whole
//	ip/24/48      both
//	ip/32/128     every address apart, IPv6 included
//	header:NAME   the request header NAME
//	trusted_header:NAME
//	              the request header NAME when the request comes straight
//	              from one of trusted_proxies (an authenticator that sets
//	              it); from any other peer the identity is missing
//	cookie:NAME   the cookie NAME
//	query:NAME    the query parameter NAME
//	method        the request method
//	route         the matched path pattern, e.g. /users/{id}
//	const:VALUE   the constant VALUE: one bucket shared by every request
func parseIdentity(s string) (identity, error) {
	id := identity{spec: s}
	kind, arg, hasArg := strings.Cut(s, ":")
	id.arg, id.hasArg = arg, hasArg
	noArg := func() error {
		if hasArg {
			return fmt.Errorf("identity %q: %s takes no value", s, kind)
		}
		return nil
	}
	needArg := func(what string) error {
		if arg == "" {
			return fmt.Errorf("identity %q needs a %s, as in %s:%s", s, what, kind, map[string]string{"header": "X-API-Key", "trusted_header": "X-Team", "cookie": "session", "query": "api_key", "const": "all"}[kind])
		}
		return nil
	}
	switch {
	case kind == "ip" || strings.HasPrefix(kind, "ip/"):
		id.kind, id.bits4, id.bits6 = idIP, 32, clientip.DefaultIPv6Bits
		if err := noArg(); err != nil {
			return id, err
		}
		if rest, ok := strings.CutPrefix(kind, "ip/"); ok {
			if err := parseIPBits(&id, rest); err != nil {
				return id, fmt.Errorf("identity %q: %v", s, err)
			}
		}
	case kind == "header":
		id.kind = idHeader
		if err := needArg("header name"); err != nil {
			return id, err
		}
		if !validToken(arg) {
			return id, fmt.Errorf("identity %q: %q is not a valid header name", s, arg)
		}
		id.arg = http.CanonicalHeaderKey(arg)
	case kind == "trusted_header":
		id.kind = idTrustedHeader
		if err := needArg("header name"); err != nil {
			return id, err
		}
		if !validToken(arg) {
			return id, fmt.Errorf("identity %q: %q is not a valid header name", s, arg)
		}
		id.arg = http.CanonicalHeaderKey(arg)
	case kind == "cookie":
		id.kind = idCookie
		if err := needArg("cookie name"); err != nil {
			return id, err
		}
		if !validToken(arg) {
			return id, fmt.Errorf("identity %q: %q is not a valid cookie name", s, arg)
		}
	case kind == "query":
		id.kind = idQuery
		if err := needArg("query parameter name"); err != nil {
			return id, err
		}
	case kind == "const":
		id.kind = idConst
		if err := needArg("value"); err != nil {
			return id, err
		}
	case kind == "method":
		id.kind = idMethod
		if err := noArg(); err != nil {
			return id, err
		}
	case kind == "route":
		id.kind = idRoute
		if err := noArg(); err != nil {
			return id, err
		}
	default:
		if best := yamlnode.Suggest(kind, identityKinds); best != "" {
			return id, fmt.Errorf("unknown identity %q (did you mean %q? %s)", s, best+strings.TrimPrefix(s, kind), identityHelp)
		}
		return id, fmt.Errorf("unknown identity %q (%s)", s, identityHelp)
	}
	return id, nil
}

// parseIPBits reads "24", "64" or "24/64" after "ip/".
func parseIPBits(id *identity, s string) error {
	v4, v6, both := strings.Cut(s, "/")
	atoi := func(t string, max int, fam string) (int, error) {
		n, err := strconv.Atoi(t)
		if err != nil || n < 1 || n > max {
			return 0, fmt.Errorf("%s prefix length %q must be a whole number from 1 to %d", fam, t, max)
		}
		return n, nil
	}
	if both {
		var err error
		if id.bits4, err = atoi(v4, 32, "IPv4"); err != nil {
			return err
		}
		id.bits6, err = atoi(v6, 128, "IPv6")
		return err
	}
	n, err := atoi(v4, 128, "the")
	if err != nil {
		return err
	}
	if n <= 32 {
		id.bits4 = n
	} else {
		id.bits6 = n
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token (header, cookie and
// method names).
func validToken(s string) bool { return clientip.IsToken(s) }

// reqView is a request as the identities see it, with the client IP and
// the query computed at most once.
type reqView struct {
	r        *http.Request
	trusted  []netip.Prefix
	ipHeader string // canonical, see clientip.CanonicalHeader
	ip       netip.Addr
	ipDone   bool
	query    url.Values
	queryErr bool
}

// fromTrusted reports whether the request's direct peer is one of the
// trusted proxies.
func (v *reqView) fromTrusted() bool {
	if len(v.trusted) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(v.r.RemoteAddr)
	a := ap.Addr()
	if err != nil {
		if a, err = netip.ParseAddr(v.r.RemoteAddr); err != nil {
			return false
		}
	}
	return clientip.InPrefixes(a.Unmap().WithZone(""), v.trusted)
}

func (v *reqView) clientIP() netip.Addr {
	if !v.ipDone {
		v.ip, v.ipDone = clientip.From(v.r, v.trusted, v.ipHeader), true
	}
	return v.ip
}

// value returns the identity's value for the request, or "" when the
// request does not carry it. route is the pattern the rule matched.
func (id *identity) value(v *reqView, route string) string {
	switch id.kind {
	case idIP:
		return ipValue(v.clientIP(), id.bits4, id.bits6)
	case idHeader:
		return strings.TrimSpace(v.r.Header.Get(id.arg))
	case idTrustedHeader:
		if !v.fromTrusted() {
			return ""
		}
		return strings.TrimSpace(v.r.Header.Get(id.arg))
	case idCookie:
		c, err := v.r.Cookie(id.arg)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(c.Value)
	case idQuery:
		if v.query == nil && !v.queryErr {
			if v.r.URL == nil {
				v.queryErr = true
				return ""
			}
			v.query = v.r.URL.Query()
		}
		return strings.TrimSpace(v.query.Get(id.arg))
	case idMethod:
		return v.r.Method
	case idRoute:
		return route
	case idConst:
		return id.arg
	}
	return ""
}

// ipValue renders a client address grouped by prefix: "192.0.2.0/24" for a
// grouped address, the bare address otherwise; "" for no address.
func ipValue(a netip.Addr, bits4, bits6 int) string {
	if !a.IsValid() {
		return ""
	}
	var buf [64]byte
	return string(clientip.AppendGroup(buf[:0], a, bits4, bits6))
}

// ipKey returns the ip identity of a client address, as ipValue renders
// it, and its store key weir.Key(rule, id); ok is false for no address.
// For IPv4 it makes one allocation: the text of an IPv4 address or prefix
// has nothing weir.Key escapes, so the key ends with it and id is that end
// of the key. An IPv6 identity, whose colons the key escapes, needs its
// own string.
func ipKey(rule string, a netip.Addr, bits4, bits6 int) (id, key string, ok bool) {
	if !a.IsValid() {
		return "", "", false
	}
	var buf [64]byte
	b := clientip.AppendGroup(buf[:0], a, bits4, bits6)
	if a.Is4() {
		key = weir.Key(rule, string(b)) // string(b) stays on the stack
		if n := len(key) - len(b); n > 0 && key[n:] == string(b) {
			return key[n:], key, true
		}
	}
	id = string(b)
	return id, weir.Key(rule, id), true
}

// useIPKey returns the identity "ip:ADDR" that on_missing: use_ip counts
// a client address by, ADDR grouped as the ip identity does by default
// (an IPv6 client by its /64), and its store key weir.Key(rule, "", ADDR);
// ok is false for no address.
func useIPKey(rule string, a netip.Addr) (id, key string, ok bool) {
	if !a.IsValid() {
		return "", "", false
	}
	var buf [64]byte
	id = string(clientip.AppendGroup(append(buf[:0], "ip:"...), a, 32, clientip.DefaultIPv6Bits))
	return id, weir.Key(rule, "", id[len("ip:"):]), true
}

// canonicalIP returns the ip identity under the grouping bits4/bits6 of
// key, an address or a prefix as a result reports it: IPv4-mapped IPv6
// unmapped, IPv6 in its canonical lower-case compressed form, zones
// dropped, the address grouped by the rule's prefix. ("::ffff:203.0.113.9"
// and "203.0.113.9" are one identity, as are "2001:DB8::1" and
// "2001:db8:0::1".) ok is false when key is neither an address nor a
// prefix. A prefix shorter than the grouping is an error naming key.
func canonicalIP(key string, bits4, bits6 int) (id string, ok bool, err error) {
	var a netip.Addr
	bits := -1
	if strings.Contains(key, "/") {
		p, err := netip.ParsePrefix(key)
		if err != nil {
			return "", false, nil
		}
		a, bits = p.Addr(), p.Bits()
		if a.Is4In6() {
			bits -= 96
		}
	} else {
		var err error
		if a, err = netip.ParseAddr(key); err != nil {
			return "", false, nil
		}
	}
	a = clean(a)
	want := bits6
	if a.Is4() {
		want = bits4
	}
	if want = min(want, a.BitLen()); bits >= 0 && bits < want {
		return "", true, fmt.Errorf("key %q is a /%d, wider than the /%d the rule counts by; name an address or a prefix at least /%d long", key, bits, want, want)
	}
	return ipValue(a, bits4, bits6), true, nil
}

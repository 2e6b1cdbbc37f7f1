package replay

import (
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"strings"

	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/policy/config"
)

// Deciding in parallel. When every rule of every config counts by the
// client address (alone or with other parts), requests from clients in
// different address groups never share a key: they can be decided by
// different goroutines, each on its own store, and each store still sees
// its requests in time order. The groups are the coarsest prefixes the
// rules group addresses by (ip/24 → /24), so that one rule's identity
// never spans two partitions. Any other rule (a header, a route, a
// constant, or one whose on_missing: use_ip stands in for a header) shares
// keys across clients: the replay then decides on one goroutine.

// maxParts is how many goroutines decide at most.
const maxParts = 2

// partitioner assigns a record to a partition.
type partitioner struct {
	parts        int
	bits4, bits6 int
	trusted      []netip.Prefix
	header       string
	// A request to read the client address from when proxies are trusted.
	req http.Request
	hdr http.Header
}

// newPartitioner returns a partitioner for the prepared configs, or nil
// when they must be decided on one goroutine.
func newPartitioner(runs []*config.Config, want int) *partitioner {
	if want == 0 {
		want = min(runtime.GOMAXPROCS(0), maxParts)
	}
	if want < 2 || len(runs) == 0 {
		return nil
	}
	p := &partitioner{parts: want, bits4: 32, bits6: 128, hdr: http.Header{}}
	for i, c := range runs {
		if i > 0 && (strings.Join(c.TrustedProxies, ",") != strings.Join(runs[0].TrustedProxies, ",") || c.ClientIPHeader != runs[0].ClientIPHeader) {
			return nil
		}
		for j := range c.Rules {
			b4, b6, ok := ruleIPBits(&c.Rules[j])
			if !ok {
				return nil
			}
			p.bits4, p.bits6 = min(p.bits4, b4), min(p.bits6, b6)
		}
	}
	for _, s := range runs[0].TrustedProxies {
		pr, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			a, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return nil
			}
			pr = netip.PrefixFrom(a, a.BitLen())
		}
		p.trusted = append(p.trusted, pr)
	}
	h, ok := clientip.CanonicalHeader(runs[0].ClientIPHeader)
	if !ok {
		return nil
	}
	p.header = h
	return p
}

// ruleIPBits returns the coarsest grouping by which the rule's keys hold
// the client address, or ok false when a key can lack it.
func ruleIPBits(rc *config.RuleConfig) (bits4, bits6 int, ok bool) {
	ids := rc.Identity
	if len(ids) == 0 {
		ids = []string{"ip"}
	}
	for _, id := range ids {
		if b4, b6, isIP := ipBits(id); isIP {
			// on_missing: use_ip only applies when the identity, which
			// holds the address, is missing: the address is the key.
			return min(b4, 32), min(b6, clientip.DefaultIPv6Bits, 128), true
		}
	}
	return 0, 0, false
}

// ipBits reads an ip identity spec as package policy does: ip, ip/N (N up
// to 32 for IPv4, above for IPv6), ip/N/M.
func ipBits(spec string) (bits4, bits6 int, ok bool) {
	if spec != "ip" && !strings.HasPrefix(spec, "ip/") {
		return 0, 0, false
	}
	bits4, bits6 = 32, clientip.DefaultIPv6Bits
	rest, has := strings.CutPrefix(spec, "ip/")
	if !has {
		return bits4, bits6, true
	}
	a, b, both := strings.Cut(rest, "/")
	n, err := strconv.Atoi(a)
	if err != nil {
		return 0, 0, false
	}
	if both {
		m, err := strconv.Atoi(b)
		if err != nil {
			return 0, 0, false
		}
		return n, m, true
	}
	if n <= 32 {
		return n, bits6, true
	}
	return bits4, n, true
}

// of returns rec's partition: its client address, as the policy finds
// it, grouped and hashed.
func (p *partitioner) of(rec *Record) int {
	var a netip.Addr
	if len(p.trusted) == 0 {
		a = parseAddr(rec.Addr)
	} else {
		r := &p.req
		r.RemoteAddr = rec.Addr
		clear(p.hdr)
		if rec.XFF != "" {
			p.hdr["X-Forwarded-For"] = []string{rec.XFF}
		}
		for _, x := range rec.Extra {
			p.hdr[x.Name] = []string{x.Value}
		}
		r.Header = p.hdr
		a = clientip.From(r, p.trusted, p.header)
	}
	if !a.IsValid() {
		return 0
	}
	bits := p.bits6
	if a.Is4() {
		bits = p.bits4
	}
	pr, err := a.Prefix(bits)
	if err != nil {
		return 0
	}
	b := pr.Addr().As16()
	var h uint64 = 14695981039346656037
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return int(h % uint64(p.parts))
}

// parseAddr reads an address or host:port as net/http's RemoteAddr holds
// it, unmapping IPv4-mapped IPv6 as package clientip does.
func parseAddr(s string) netip.Addr {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("")
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

package clientip

import (
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// clientIPRef is From as it was before it stopped splitting
// X-Forwarded-For and parsing addresses it knew would fail, with the
// header choice added: the reference the rewrite must agree with.
func clientIPRef(r *http.Request, trusted []netip.Prefix, header string) netip.Addr {
	peer := parseHostAddrRef(r.RemoteAddr)
	if !peer.IsValid() || !InPrefixes(peer, trusted) {
		return peer
	}
	xffWalk := func() (netip.Addr, bool) {
		hops := make([]string, 0, 4)
		for _, h := range r.Header.Values("X-Forwarded-For") {
			for _, e := range strings.Split(h, ",") {
				if e = strings.TrimSpace(e); e != "" {
					hops = append(hops, e)
				}
			}
		}
		if len(hops) == 0 {
			return netip.Addr{}, false
		}
		last := peer
		for i := len(hops) - 1; i >= 0; i-- {
			a := parseHostAddrRef(hops[i])
			if !a.IsValid() {
				return last, true
			}
			if !InPrefixes(a, trusted) {
				return a, true
			}
			last = a
		}
		return last, true
	}
	lastOf := func(name string) netip.Addr {
		var entries []string
		for _, v := range r.Header.Values(name) {
			parts := strings.Split(v, ",")
			if e := strings.TrimSpace(parts[len(parts)-1]); e != "" {
				entries = append(entries, e)
			}
		}
		if len(entries) == 0 {
			return netip.Addr{}
		}
		return parseHostAddrRef(entries[len(entries)-1])
	}
	switch header {
	case "X-Forwarded-For":
		if a, ok := xffWalk(); ok {
			return a
		}
		return peer
	case "auto":
		real := lastOf("X-Real-IP")
		if real.IsValid() && !InPrefixes(real, trusted) {
			return real
		}
		if a, ok := xffWalk(); ok {
			return a
		}
		if real.IsValid() {
			return real
		}
		return peer
	}
	if a := lastOf(header); a.IsValid() {
		return a
	}
	return peer
}

func parseHostAddrRef(s string) netip.Addr {
	if s == "" {
		return netip.Addr{}
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return clean(a)
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

// hostAddrs are addresses as RemoteAddr and forwarding headers hold them.
var hostAddrs = []string{
	"", "1.2.3.4", "1.2.3.4:80", "10.0.0.1", "10.0.0.1:1", "10.9.9.9:65535",
	"127.0.0.1", "::1", "[::1]", "[::1]:80", "::ffff:10.0.0.2", "[::ffff:10.0.0.2]:5",
	"[::ffff:203.0.113.5]", "2001:db8::1", "[2001:db8::1]:443", "fd00::1", "[fd00::1]:5",
	"fe80::1%eth0", "[fe80::1%eth0]:80", "[fe80::1%eth0]", "fe80::1%eth0:1",
	"1.2.3.4%eth0", "[1.2.3.4]", "[1.2.3.4]:80", "1.2.3.4:", ":80", "[]:80", "[",
	"]", "[]", "[::1", "::1]", "[::1]]:80", "[::1]:80:90", "1.2.3.4:80:90",
	"1.2.3", "1.2.3.4.5", "01.2.3.4", "256.1.1.1", "unknown", "garbage", "@",
	"host:80", "localhost", " 1.2.3.4", "1.2.3.4 ", "1::2::3", ":::", "::",
	"0.0.0.0", "203.0.113.5", "198.51.100.7", "6.6.6.6:1234", "a:b", "%", "%:1",
	"[%]:1", "::%:1",
}

// TestParseHostAddrMatchesRef checks parseHostAddr against the reference
// on a table and on random strings.
func TestParseHostAddrMatchesRef(t *testing.T) {
	in := append([]string(nil), hostAddrs...)
	rng := rand.New(rand.NewPCG(3, 4))
	const alphabet = "0123456789abcdef.:[]%fz "
	for range 20000 {
		b := make([]byte, rng.IntN(14))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		in = append(in, string(b))
	}
	for _, s := range in {
		if got, want := parseHostAddr(s), parseHostAddrRef(s); got != want {
			t.Errorf("parseHostAddr(%q) = %v, want %v", s, got, want)
		}
	}
}

func FuzzParseHostAddr(f *testing.F) {
	for _, s := range hostAddrs {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := parseHostAddr(s), parseHostAddrRef(s); got != want {
			t.Fatalf("parseHostAddr(%q) = %v, want %v", s, got, want)
		}
	})
}

// TestClientIPMatchesRef checks From against the reference on
// generated requests: peers trusted or not, X-Forwarded-For lines with
// empty, spaced, trusted, untrusted and garbage entries, and X-Real-IP.
func TestClientIPMatchesRef(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("fd00::/8")}
	entries := []string{"", " ", "10.0.0.7", "10.0.0.8:80", "203.0.113.5", " 203.0.113.6 ", "6.6.6.6", "[2001:db8::1]:443", "fd00::9", "unknown", "::ffff:10.1.2.3", "127.0.0.1"}
	peers := []string{"10.0.0.2:5", "127.0.0.1:5", "[fd00::1]:5", "198.51.100.1:5", "garbage", "", "10.0.0.2", "[::ffff:10.0.0.2]:5"}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 5000 {
		r := &http.Request{Header: http.Header{}, RemoteAddr: peers[rng.IntN(len(peers))]}
		for n := rng.IntN(4); n > 0; n-- {
			var b strings.Builder
			for k := rng.IntN(4); k >= 0; k-- {
				b.WriteString(entries[rng.IntN(len(entries))])
				if k > 0 {
					b.WriteString(",")
				}
			}
			r.Header.Add("X-Forwarded-For", b.String())
		}
		for n := rng.IntN(3); n > 0; n-- {
			r.Header.Add("X-Real-IP", entries[rng.IntN(len(entries))])
		}
		if rng.IntN(2) == 0 {
			r.Header.Set("Cf-Connecting-Ip", entries[rng.IntN(len(entries))])
		}
		for _, tr := range [][]netip.Prefix{nil, trusted} {
			for _, h := range []string{"auto", "X-Forwarded-For", "X-Real-Ip", "Cf-Connecting-Ip"} {
				if got, want := From(r, tr, h), clientIPRef(r, tr, h); got != want {
					t.Fatalf("header %s peer %q XFF %q X-Real-IP %q trusted %v: %v, want %v", h, r.RemoteAddr, r.Header.Values("X-Forwarded-For"), r.Header.Values("X-Real-IP"), tr != nil, got, want)
				}
			}
			if got, want := From(r, tr, ""), clientIPRef(r, tr, "auto"); got != want {
				t.Fatalf("From with no header: %v, want %v", got, want)
			}
		}
	}
}

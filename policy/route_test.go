package policy

import (
	"bufio"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// muxRoute is how policy matched a path before pathPattern: a one-pattern
// http.ServeMux, whose Handler gives the pattern for a match and for a
// redirect to one.
func muxRoute(mux *http.ServeMux, r *http.Request) (string, bool) {
	if r.URL == nil {
		return "", false
	}
	_, pat := mux.Handler(r)
	return pat, pat != ""
}

// matchRequest is what Check asks of a rule's path for req.
func matchRequest(pp *pathPattern, req *http.Request) bool {
	var rp reqPath
	return pp.match(rp.of(req))
}

// routePatterns are the patterns the differential tests compare, odd ones
// included: ServeMux accepts unclean patterns, escapes and empty segments.
var routePatterns = []string{
	"/", "/{$}", "/api", "/api/", "/api/login", "/api/login/", "/api/{x}",
	"/api/{x}/", "/api/{x}/{$}", "/api/{x...}", "/api/{$}", "/users/{id}",
	"/users/{id}/posts", "/files/{path...}", "/{x}", "/{x}/", "/{x}/{$}",
	"/{a}/{b...}", "/{a}/b/{c}", "/a/b/c", "/a//b", "//", "///", "/a/../b",
	"/a/./b", "/..", "/a/..", "/a%2Fb", "/a/%2F", "/a/%2f/", "/caf%C3%A9",
	"/café", "/%zz", "/100%25", "/a%20b", "/.well-known/{rest...}",
	"/%7Bx%7D", "/a/b/", "/login", "/a.b/{c}",
}

// routeSegments build the generated paths.
var routeSegments = []string{
	"", "api", "login", "users", "42", "posts", "files", "a", "b", "c", ".",
	"..", "...", "%2F", "%2f", "a%2Fb", "%2E%2E", "%2e", "café", "caf%C3%A9",
	"%zz", "%", "%25", "100%25", "x%20y", "a.b", ".well-known", "%7Bx%7D",
	"{x}", "$", "%E2%82%AC", "€", "a+b", "a;b", "@",
}

// routePaths returns fixed and generated request targets: paths, some
// with a query.
func routePaths() []string {
	paths := []string{
		"", "/", "//", "///", "*", "/api", "/api/", "/api//", "/api//login",
		"/api/../api/login", "/api/./login", "/api/login/", "/api/login//",
		"/api/login/..", "/x/../api/login", "/../api/login", "/api/%2e%2e/login",
		"/api%2Flogin", "/api/login%2F", "/users/42", "/users/42/",
		"/users//posts", "/users/42/posts", "/users/42/posts/", "/files",
		"/files/", "/files/a/b/c.txt", "/a/b/c", "/a/b/c/", "/a%2Fb", "/a/%2F",
		"/a/%2F/", "/café", "/caf%C3%A9", "/%zz", "/100%25", "/a%20b",
		"/.well-known/acme/x", "/.well-known", "/login?x=1", "/api?x=/y",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 400 {
		var b strings.Builder
		for n := rng.IntN(5); n >= 0; n-- {
			b.WriteString("/")
			if rng.IntN(8) == 0 {
				b.WriteString("/")
			}
			b.WriteString(routeSegments[rng.IntN(len(routeSegments))])
		}
		switch rng.IntN(6) {
		case 0:
			b.WriteString("/")
		case 1:
			b.WriteString("//")
		case 2:
			b.WriteString("?q=1")
		}
		paths = append(paths, b.String())
	}
	return paths
}

// routeRequests builds the requests for one target: as a server reads it
// off the wire (URL.RawPath set when the client escaped differently from
// Go), and as code builds it (Path alone, or with a RawPath that may not
// match it).
func routeRequests(target string) []*http.Request {
	var out []*http.Request
	for _, m := range []string{"GET", "HEAD", "POST", "CONNECT", ""} {
		wireMethod := m
		if wireMethod == "" {
			wireMethod = "GET"
		}
		if target != "" {
			r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(wireMethod + " " + target + " HTTP/1.1\r\nHost: example.com\r\n\r\n")))
			if err == nil {
				r.Method = m
				out = append(out, r)
			}
		}
		path, _, _ := strings.Cut(target, "?")
		unescaped, err := url.PathUnescape(path)
		if err != nil {
			unescaped = path
		}
		out = append(out,
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: path}},
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: strings.TrimPrefix(unescaped, "/")}},
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: " " + strings.TrimPrefix(unescaped, "/")}},
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: unescaped}},
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: unescaped, RawPath: path}},
			&http.Request{Method: m, Host: "example.com", URL: &url.URL{Path: path, RawPath: "/raw" + path}},
		)
	}
	return out
}

// TestPathPatternMatchesServeMux checks that pathPattern agrees with the
// one-pattern ServeMux policy used before, on whether a request matches
// and on the route, for a table of patterns and generated paths.
func TestPathPatternMatchesServeMux(t *testing.T) {
	paths := routePaths()
	var reqs []*http.Request
	for _, p := range paths {
		reqs = append(reqs, routeRequests(p)...)
	}
	reqs = append(reqs, &http.Request{Method: "GET"}) // no URL
	matched := 0
	for _, pat := range routePatterns {
		pp, msg := compilePath(pat)
		if msg != "" {
			t.Fatalf("%s: %s", pat, msg)
		}
		mux := http.NewServeMux()
		mux.Handle(pat, http.NotFoundHandler())
		for _, r := range reqs {
			want, wantOK := muxRoute(mux, r)
			got := matchRequest(pp, r)
			if got != wantOK {
				t.Errorf("pattern %q, %s %q (RawPath %q): matched %v, ServeMux %v (%q)", pat, r.Method, urlPath(r), urlRawPath(r), got, wantOK, want)
				continue
			}
			if !got {
				continue
			}
			matched++
			// ServeMux gives the pattern, except for a CONNECT that it
			// redirects to add a slash, where it gives the path it
			// redirects to; policy counts by the pattern, so that route
			// identities stay bounded.
			if want != pat && r.Method != http.MethodConnect {
				t.Errorf("pattern %q, %s %q: ServeMux gave route %q", pat, r.Method, urlPath(r), want)
			}
		}
	}
	if matched < 1000 {
		t.Errorf("only %d matches: the generated paths do not exercise the patterns", matched)
	}
}

func urlPath(r *http.Request) string {
	if r.URL == nil {
		return "<nil URL>"
	}
	return r.URL.Path
}

func urlRawPath(r *http.Request) string {
	if r.URL == nil {
		return ""
	}
	return r.URL.RawPath
}

// TestRuleMatchHost checks the host match against the code it replaced.
func TestRuleMatchHost(t *testing.T) {
	ref := func(r *rule, host string) bool {
		h := strings.ToLower(host)
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		h = strings.TrimSuffix(h, ".")
		if r.hostWild {
			return strings.HasSuffix(h, "."+r.host)
		}
		return h == r.host
	}
	rules := []string{"api.example.com", "*.example.com", "*.com", "API.Example.COM", "[::1]", "münchen.de", "*.münchen.de", "straße.de", "k.example"}
	hosts := []string{
		"", "api.example.com", "API.EXAMPLE.COM", "api.example.com.", "api.example.com:8443",
		"Api.Example.Com.:80", "a.api.example.com", "example.com", "xexample.com", ".example.com",
		"a.b.EXAMPLE.com", "[::1]", "[::1]:80", "::1", "api.example.com:", "api.example.com:x:y",
		"MÜNCHEN.de", "münchen.de", "x.MÜNCHEN.DE:443", "STRASSE.de", "straße.de", "STRAẞE.DE",
		"\u212a.example", "K.EXAMPLE", "İ.com", ":80", ".", "..",
	}
	for _, spec := range rules {
		r := &rule{}
		h := strings.ToLower(spec)
		r.host, r.hostWild = strings.CutPrefix(h, "*.")
		r.dotHost = "." + r.host
		for _, host := range hosts {
			if got, want := r.matchHost(host), ref(r, host); got != want {
				t.Errorf("host %q against %q: %v, want %v", host, spec, got, want)
			}
		}
	}
}

// FuzzPathPattern compares pathPattern with ServeMux on any path.
func FuzzPathPattern(f *testing.F) {
	for i, p := range routePaths()[:60] {
		f.Add(routePatterns[i%len(routePatterns)], p, "")
	}
	f.Add("/a/{x}/", "/a/%2F/", "/a/%2F/")
	f.Add("/api/", " api/", "") // found by fuzzing: a CONNECT path without the leading slash
	f.Fuzz(func(t *testing.T, pat, path, rawPath string) {
		if strings.ContainsAny(pat, " \t") || !strings.HasPrefix(pat, "/") {
			return
		}
		pp, msg := compilePath(pat)
		if msg != "" {
			return
		}
		mux := http.NewServeMux()
		mux.Handle(pat, http.NotFoundHandler())
		for _, m := range []string{"GET", "CONNECT"} {
			r := &http.Request{Method: m, URL: &url.URL{Path: path, RawPath: rawPath}}
			want, wantOK := muxRoute(mux, r)
			if got := matchRequest(pp, r); got != wantOK {
				t.Fatalf("pattern %q, %s path %q raw %q: matched %v, ServeMux %v (%q)", pat, m, path, rawPath, got, wantOK, want)
			}
		}
	})
}

// TestSegEqual checks the comparison that decodes as it goes against
// unescaping first.
func TestSegEqual(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const alphabet = "%2fF/aA0g+z"
	gen := func() string {
		b := make([]byte, rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 50000 {
		seg, lit := gen(), gen()
		if rng.IntN(3) == 0 {
			lit = pathUnescape(seg)
		}
		for _, unescape := range []bool{false, true} {
			want := seg == lit
			if unescape {
				want = pathUnescape(seg) == lit
			}
			if got := segEqual(seg, lit, unescape); got != want {
				t.Fatalf("segEqual(%q, %q, %v) = %v, want %v", seg, lit, unescape, got, want)
			}
		}
	}
}

package policy

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// pathPattern is a compiled match.path: the one-pattern http.ServeMux that
// validates it (see compilePath), reduced to what Check needs, so that
// matching a request allocates nothing beyond cleaning an unclean path and
// URL.EscapedPath's check of a RawPath, once per request for all rules.
//
// It reproduces what ServeMux.Handler answers for a tree holding only this
// pattern, which has neither method nor host (compilePath refuses both), so
// that the request's method and host play no part except that CONNECT
// paths are not cleaned:
//
//   - The path is the escaped path, cleaned (path.Clean, keeping a trailing
//     slash) unless the method is CONNECT; each segment is unescaped before
//     it is compared, so "/a%2Fb" is the one segment "a/b".
//   - A literal segment matches the equal segment, "{name}" any segment but
//     the final "/" of a trailing slash, "{name...}" and the implicit
//     wildcard of a trailing-slash pattern whatever is left, "{$}" only the
//     final "/".
//   - Where ServeMux would redirect instead of serving, it counts as a
//     match: an unclean path (/api//login for /api/login), and a path that
//     matches exactly once a slash is appended (/api for /api/).
//
// The route is always the pattern; ServeMux alone gives the redirect's
// path instead when it adds a slash to a CONNECT path. The GODEBUG setting
// httpmuxgo121, which turns ServeMux back to Go 1.21's literal patterns, is
// not followed.
//
// ServeMux files the pattern's segments in a tree; with one pattern the
// tree is a chain, so matching walks it without backtracking.
type pathPattern struct {
	str  string // the pattern as written: the route identity
	segs []patSeg
}

type segKind uint8

const (
	// segLit is a literal segment, unescaped. "{$}" is the literal "/",
	// which only the final segment of a trailing slash is.
	segLit segKind = iota
	// segWild is "{name}", or an empty literal segment (the pattern
	// "/a//b"), which ServeMux files under the same node as a wildcard.
	segWild
	// segMulti is "{name...}", or the anonymous wildcard a trailing slash
	// ends a pattern with; it is always the last segment.
	segMulti
)

type patSeg struct {
	kind segKind
	s    string
}

// parsePathPattern splits a pattern that ServeMux accepted into segments,
// as net/http's parsePattern does.
func parsePathPattern(p string) *pathPattern {
	pp := &pathPattern{str: p}
	rest := p
	for len(rest) > 0 {
		rest = rest[1:] // drop the slash
		if rest == "" {
			pp.segs = append(pp.segs, patSeg{kind: segMulti})
			break
		}
		i := strings.IndexByte(rest, '/')
		if i < 0 {
			i = len(rest)
		}
		var seg string
		seg, rest = rest[:i], rest[i:]
		if !strings.HasPrefix(seg, "{") {
			seg = pathUnescape(seg)
			if seg == "" {
				pp.segs = append(pp.segs, patSeg{kind: segWild})
			} else {
				pp.segs = append(pp.segs, patSeg{kind: segLit, s: seg})
			}
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(seg, "{"), "}")
		if name == "$" {
			pp.segs = append(pp.segs, patSeg{kind: segLit, s: "/"})
			break
		}
		if n, multi := strings.CutSuffix(name, "..."); multi {
			pp.segs = append(pp.segs, patSeg{kind: segMulti, s: n})
			break
		}
		pp.segs = append(pp.segs, patSeg{kind: segWild, s: name})
	}
	return pp
}

// reqPath is a request's path as ServeMux matches it, worked out once per
// request for all the rules: an unclean path costs its cleaning once.
type reqPath struct {
	p        string
	unescape bool // the segments of p are escaped
	noURL    bool
	done     bool
}

func (rp *reqPath) of(req *http.Request) *reqPath {
	if rp.done {
		return rp
	}
	rp.done = true
	u := req.URL
	if u == nil {
		rp.noURL = true
		return rp
	}
	// ServeMux matches r.URL.EscapedPath() and unescapes each segment.
	// Without RawPath, EscapedPath is Path escaped: escaping leaves '/' and
	// '.' alone, so it commutes with cleaning and splitting, and unescaping
	// a segment gives the segment of Path back. Matching Path itself, with
	// no unescaping, is then the same and saves EscapedPath's allocation.
	// The argument needs a path that starts with a slash, which matching
	// drops: cleaning makes sure of it, but a CONNECT path is not cleaned.
	connect := req.Method == http.MethodConnect
	rp.p = u.Path
	if u.RawPath != "" || connect && !strings.HasPrefix(u.Path, "/") {
		rp.p, rp.unescape = u.EscapedPath(), true
	}
	if !connect {
		rp.p = cleanPath(rp.p)
	}
	return rp
}

// match reports whether ServeMux.Handler would give the pattern for the
// request whose path rp is.
func (pp *pathPattern) match(rp *reqPath) bool {
	if rp.noURL {
		return false
	}
	p := rp.p
	// ServeMux.matchOrRedirect: a match that is not exact, or no match,
	// is retried with a slash appended, which counts if it matches exactly.
	m := pp.matchPath(p, false, rp.unescape)
	if m && pp.exact(p, false) {
		return true
	}
	if p != "" && p[len(p)-1] != '/' && pp.matchPath(p, true, rp.unescape) && pp.exact(p, true) {
		return true
	}
	return m
}

// matchPath is net/http's routingNode.matchPath over the chain of the
// pattern's segments, for p, or p+"/" when slash is set.
func (pp *pathPattern) matchPath(p string, slash, unescape bool) bool {
	segs := pp.segs
	for {
		if p == "" {
			if !slash {
				// Only the leaf after the last segment holds the
				// pattern; a multi wildcard's leaf is reached below.
				return len(segs) == 0
			}
			p, slash = "/", false
		}
		if len(segs) == 0 {
			return false // the leaf has no children
		}
		var seg string
		seg, p = firstSegment(p)
		switch s := &segs[0]; s.kind {
		case segLit:
			if !segEqual(seg, s.s, unescape) {
				return false
			}
		case segWild:
			// ServeMux looks seg up among the children, where "" finds
			// the wildcard's node, then tries the wildcard unless seg is
			// the final "/".
			if segEqual(seg, "/", unescape) {
				return false
			}
		case segMulti:
			return true
		}
		segs = segs[1:]
	}
}

// exact is net/http's exactMatch for a path that matched: p, or p+"/" when
// slash is set.
func (pp *pathPattern) exact(p string, slash bool) bool {
	if pp.segs[len(pp.segs)-1].kind != segMulti {
		return true
	}
	if !slash && len(p) > 0 && p[len(p)-1] != '/' {
		return false
	}
	n := strings.Count(p, "/")
	if slash {
		n++
	}
	return len(pp.segs) == n
}

// firstSegment is net/http's, without the unescaping (see segEqual): the
// first segment of p, whose first byte, normally a slash, it drops, and
// the rest; "/" alone is the segment "/".
func firstSegment(p string) (seg, rest string) {
	if p == "/" {
		return "/", ""
	}
	p = p[1:]
	i := strings.IndexByte(p, '/')
	if i < 0 {
		i = len(p)
	}
	return p[:i], p[i:]
}

// segEqual reports whether the path segment seg is t: when unescape is set,
// whether pathUnescape(seg) == t, decoding as it compares rather than
// allocating the unescaped segment.
func segEqual(seg, t string, unescape bool) bool {
	if !unescape || strings.IndexByte(seg, '%') < 0 || !validEscapes(seg) {
		return seg == t
	}
	j := 0
	for i := 0; i < len(seg); j++ {
		c := seg[i]
		if c == '%' {
			c = unhex(seg[i+1])<<4 | unhex(seg[i+2])
			i += 3
		} else {
			i++
		}
		if j >= len(t) || t[j] != c {
			return false
		}
	}
	return j == len(t)
}

// validEscapes reports whether every '%' in s starts an escape of two hex
// digits, as url.PathUnescape requires.
func validEscapes(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i+2 >= len(s) || !ishex(s[i+1]) || !ishex(s[i+2]) {
				return false
			}
			i += 2
		}
	}
	return true
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// pathUnescape is net/http's: an invalid escape leaves the segment as is.
func pathUnescape(s string) string {
	u, err := url.PathUnescape(s)
	if err != nil {
		return s
	}
	return u
}

// cleanPath is net/http's: p rooted and cleaned, keeping a trailing slash.
// It allocates only when p is not clean.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		if len(p) == len(np)+1 && strings.HasPrefix(p, np) {
			np = p
		} else {
			np += "/"
		}
	}
	return np
}

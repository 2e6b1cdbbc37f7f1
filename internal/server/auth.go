package server

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/weirotel"
)

// handleAuth serves GET /v1/auth, the endpoint of nginx auth_request,
// Traefik ForwardAuth and Caddy forward_auth.
//
// The proxy asks it about the request it is holding, described by one
// family of headers, which server.auth_headers names: original, the URI,
// method and host in X-Original-URI, X-Original-Method and X-Original-Host
// (nginx), or forwarded, in X-Forwarded-Uri, X-Forwarded-Method and
// X-Forwarded-Host (Traefik, Caddy); auto (the default) takes the family
// present and refuses a request whose two families disagree. The client
// is in X-Real-IP or X-Forwarded-For, as client_ip_header says; in auto,
// a request carrying X-Forwarded-Uri (Caddy and Traefik set
// X-Forwarded-For, and Caddy passes a client's X-Real-IP on) is read from
// X-Forwarded-For alone (dropClientRealIP). Every other header of the auth request is taken as the
// original request's (proxies forward them), so header: and cookie:
// identities work. The forwarded client address is believed only when the
// peer (the proxy) is in trusted_proxies; otherwise the peer's own
// address is the client.
//
// Any method is accepted, since nginx's subrequest carries the original
// request's. Rules using the concurrency algorithm hold their slot until
// the rule's period ends, as no proxy reports when a request finishes.
//
// Allowed: 200 with RateLimit-Policy and RateLimit. Limited: 403 with
// Retry-After, the same headers and a JSON body, because nginx turns any
// other status but 401 into a 500; ?status=429 answers 429 for proxies
// that pass the status on (Traefik, Caddy). A deny-listed client gets 403.
func (s *Server) handleAuth(w http.ResponseWriter, r *http.Request) {
	limitedStatus := http.StatusForbidden
	if v := r.URL.Query().Get("status"); v != "" {
		switch v {
		case "429":
			limitedStatus = http.StatusTooManyRequests
		case "403":
		default:
			writeError(w, http.StatusBadRequest, codeBadRequest, "status=%q: want 403 or 429", v)
			return
		}
	}
	p := s.holder.Load()
	cfg := p.Config()
	orig, _, err := originalRequest(r, cfg.Server.AuthHeaders)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeBadRequest, "%v", err)
		return
	}
	if h, _ := clientip.CanonicalHeader(cfg.ClientIPHeader); h == clientip.Auto {
		if err := dropClientRealIP(r, orig, cfg); err != nil {
			writeError(w, http.StatusBadRequest, codeBadRequest, "%v", err)
			return
		}
	}
	v := p.Check(r.Context(), orig)
	if v.Denied && len(v.Results) == 0 {
		s.metrics.decision(ruleDenyList, resultDenied)
		weirotel.CheckFrom(r.Context()).Denied()
	}
	if v.AllowListed {
		s.metrics.decision(ruleAllowList, resultAllowed)
	}
	statuses := make([]httplimit.Status, 0, len(v.Results))
	for _, rr := range v.Results {
		if rr.Skipped || rr.Denied {
			continue
		}
		statuses = append(statuses, httplimit.Status{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow})
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	httplimit.WriteHeaders(h, statuses, httplimit.MostRestrictive(statuses), formatter(p))
	switch {
	case v.Denied:
		rej := httplimit.Rejection{Status: http.StatusForbidden}
		if rr, ok := v.Limited(); ok {
			rej.Rule = rr.Rule
		}
		httplimit.WriteRejection(w, orig, rej)
	case !v.Allowed:
		rr, _ := v.Limited()
		retry, _ := httplimit.RetryAfter(statuses)
		rej := httplimit.Rejection{Status: http.StatusTooManyRequests, Rule: rr.Rule, Result: rr.Result, RetryAfter: retry, Statuses: statuses}
		if limitedStatus == http.StatusTooManyRequests {
			httplimit.WriteRejection(w, orig, rej)
			return
		}
		// 403 for nginx; the body still says rate_limited.
		prob := httplimit.ProblemOf(rej)
		prob.Status, prob.Title = http.StatusForbidden, http.StatusText(http.StatusForbidden)
		body, _ := json.Marshal(prob)
		h.Set("Content-Type", httplimit.ProblemContentType)
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write(append(body, '\n'))
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// authFamily is one family of headers that describe the original request.
type authFamily struct {
	uri, method, host string
	setting           string // the server.auth_headers value that picks it
	senders           string // the proxies that send it
}

var (
	familyOriginal  = authFamily{"X-Original-URI", "X-Original-Method", "X-Original-Host", config.AuthHeadersOriginal, "nginx"}
	familyForwarded = authFamily{"X-Forwarded-Uri", "X-Forwarded-Method", "X-Forwarded-Host", config.AuthHeadersForwarded, "Traefik, Caddy"}
)

// originalRequest rebuilds the request a proxy is asking about from the
// auth request's headers, read from the family that setting (the config's
// server.auth_headers) names. With auto, the family whose URI header is
// present; a request carrying both families that disagree on the URI,
// the method or the host is refused, since a client can send the family
// its proxy does not set, and the proxy passes it on.
//
// fam is the family read: config.AuthHeadersOriginal or
// config.AuthHeadersForwarded.
func originalRequest(r *http.Request, setting string) (orig *http.Request, fam string, err error) {
	f, other := familyOriginal, familyForwarded
	switch setting {
	case config.AuthHeadersOriginal:
	case config.AuthHeadersForwarded:
		f, other = familyForwarded, familyOriginal
	default:
		if firstHeader(r, f.uri) == "" && firstHeader(r, other.uri) != "" {
			f, other = other, f
		}
	}
	uri := firstHeader(r, f.uri)
	if uri == "" {
		if setting == config.AuthHeadersOriginal || setting == config.AuthHeadersForwarded {
			return nil, "", &headerError{"the auth request lacks " + f.uri + ", which server.auth_headers: " + setting +
				" says the proxy (" + f.senders + ") sends; weir cannot tell which request to decide"}
		}
		return nil, "", errMissingURI
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		// A full URL, as some proxies send.
		if u, err = url.Parse(uri); err != nil || u.Path == "" {
			return nil, "", &headerError{"the original URI " + quoteShort(uri) + " is not a request URI"}
		}
	}
	method := strings.ToUpper(firstHeader(r, f.method))
	if method == "" {
		method = http.MethodGet
	}
	if !validMethod(method) {
		return nil, "", &headerError{"the original method " + quoteShort(method) + " is not an HTTP method"}
	}
	host := firstHeader(r, f.host)
	if host == "" {
		host = r.Host
	}
	if setting != config.AuthHeadersOriginal && setting != config.AuthHeadersForwarded {
		for _, c := range []struct {
			name, other, value string
			fold               bool
		}{{f.uri, other.uri, uri, false}, {f.method, other.method, method, true}, {f.host, other.host, host, true}} {
			v := firstHeader(r, c.other)
			if v == "" || v == c.value || c.fold && strings.EqualFold(v, c.value) {
				continue
			}
			return nil, "", &headerError{"the auth request carries " + c.name + " " + quoteShort(c.value) + " and " + c.other + " " + quoteShort(v) +
				", which disagree: a client may have sent one of them. Set server.auth_headers to original (nginx: X-Original-URI/Method/Host) or " +
				"forwarded (Traefik, Caddy: X-Forwarded-Uri/Method/Host), and make the proxy strip the family it does not set"}
		}
	}
	orig = &http.Request{
		Method:     method,
		URL:        u,
		RequestURI: uri,
		Proto:      r.Proto,
		ProtoMajor: r.ProtoMajor,
		ProtoMinor: r.ProtoMinor,
		Header:     r.Header.Clone(),
		Host:       host,
		RemoteAddr: r.RemoteAddr,
	}
	return orig.WithContext(r.Context()), f.setting, nil
}

// dropClientRealIP removes X-Real-IP from orig when a client may have
// written it, under client_ip_header: auto. Caddy and Traefik, which send
// the forwarded family, write the client in X-Forwarded-For, and Caddy
// passes a client's own X-Real-IP on: a request read as the forwarded
// family, or carrying X-Forwarded-Uri under auth_headers: auto, is read
// from X-Forwarded-For alone. Under auto, a request carrying both URI
// headers may come from either kind of proxy (nginx passes a client's
// X-Forwarded-* on, and writes X-Real-IP): its X-Real-IP and
// X-Forwarded-For must then name the same client, or it is refused.
func dropClientRealIP(r, orig *http.Request, cfg *config.Config) error {
	switch cfg.Server.AuthHeaders {
	case config.AuthHeadersOriginal:
		return nil
	case config.AuthHeadersForwarded:
	default:
		if firstHeader(r, familyForwarded.uri) == "" {
			return nil
		}
		if real := firstHeader(r, "X-Real-Ip"); real != "" && firstHeader(r, familyOriginal.uri) != "" {
			trusted := trustedPrefixes(cfg)
			byXFF, byReal := orig.Clone(r.Context()), orig.Clone(r.Context())
			byXFF.Header.Del("X-Real-Ip")
			byReal.Header.Del("X-Forwarded-For")
			if clientip.From(byXFF, trusted, clientip.Auto) != clientip.From(byReal, trusted, clientip.Auto) {
				return &headerError{"the auth request carries both " + familyOriginal.uri + " and " + familyForwarded.uri +
					", and X-Real-IP " + quoteShort(real) + " names another client than X-Forwarded-For " + quoteShort(r.Header.Get("X-Forwarded-For")) +
					": a client may have sent one of them. Set server.auth_headers to original (nginx) or forwarded (Traefik, Caddy), " +
					"set client_ip_header to the header your proxy writes, and make the proxy strip the family it does not set"}
			}
		}
	}
	orig.Header.Del("X-Real-Ip")
	return nil
}

// trustedPrefixes parses the trusted_proxies of a validated config.
func trustedPrefixes(cfg *config.Config) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cfg.TrustedProxies))
	for _, s := range cfg.TrustedProxies {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		} else if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

type headerError struct{ msg string }

func (e *headerError) Error() string { return e.msg }

var errMissingURI = &headerError{"the auth request lacks X-Original-URI (nginx: proxy_set_header X-Original-URI $request_uri) or X-Forwarded-Uri (Traefik, Caddy); weir cannot tell which request to decide"}

func firstHeader(r *http.Request, names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(r.Header.Get(n)); v != "" {
			return v
		}
	}
	return ""
}

func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func quoteShort(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	b, _ := json.Marshal(s)
	return string(b)
}

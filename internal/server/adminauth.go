package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// codeAuthThrottled answers a client refused for too many failed admin
// token attempts.
const codeAuthThrottled = "too_many_auth_failures"

// minAdminToken is the shortest admin token weir starts without a warning.
const minAdminToken = 16

// Failed admin token attempts: a client (an IPv4 address, an IPv6 /64)
// with authFailures failures within authFailWindow is refused any further
// attempt, the right token included; the first refused attempt puts it in
// a penalty box for authFailBlock. The failures are
// counted by weir's own limiter over a memory store of at most
// authFailKeys clients, so no request can grow it beyond that.
const (
	authFailures   = 10
	authFailWindow = time.Minute
	authFailBlock  = 5 * time.Minute
	authFailKeys   = 10000
)

// authFailLimit is the limit on failed attempts per client.
var authFailLimit = weir.Limit{Algorithm: weir.SlidingWindow, Rate: authFailures, Period: authFailWindow, Block: authFailBlock}

// adminAuth checks admin tokens, counts the failures and refuses clients
// that fail too often.
type adminAuth struct {
	token    string
	failures *prometheus.CounterVec
	store    *memstore.Store
}

func newAdminAuth(token string, reg prometheus.Registerer, now func() time.Time) *adminAuth {
	a := &adminAuth{
		token: token,
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weir_admin_auth_failures_total",
			Help: "Requests refused for the admin token, by reason: bad_token (missing or wrong) or throttled (the client failed too often).",
		}, []string{"reason"}),
		store: memstore.New(memstore.WithMaxKeys(authFailKeys), memstore.WithShards(16), memstore.WithClock(now)),
	}
	a.failures.WithLabelValues("bad_token")
	a.failures.WithLabelValues("throttled")
	reg.MustRegister(a.failures)
	return a
}

// authResult is what a request's Authorization header proved.
type authResult int

const (
	authNone      authResult = iota // no token sent, or the admin API is off
	authAdmin                       // the right token
	authBad                         // a missing or wrong token where one is needed; answered
	authThrottled                   // the client failed too often; answered
)

// check reads r's bearer token. With required false (the read-only
// endpoints), a request without a bearer token is authNone: an
// Authorization header of another scheme, such as the Basic credentials of
// a proxy in front, is no attempt. With required true (the admin API) a
// missing token is a failure. On failure check writes the answer: 401, or
// 429 with Retry-After for a client refused for failing too often.
func (a *adminAuth) check(w http.ResponseWriter, r *http.Request, required bool, env string) authResult {
	header := strings.TrimSpace(r.Header.Get("Authorization"))
	scheme, tok, ok := strings.Cut(header, " ")
	bearer := ok && strings.EqualFold(scheme, "Bearer")
	if a.token == "" || (!bearer && !required) {
		return authNone
	}
	client := clientKey(r.RemoteAddr)
	if res, err := a.store.Take(r.Context(), client, authFailLimit, 0); err == nil && !res.Allowed {
		// At the limit: this attempt is one failure too many, which puts
		// the client in the penalty box (or keeps it there).
		if res2, err := a.store.Take(context.WithoutCancel(r.Context()), client, authFailLimit, 1); err == nil {
			res = res2
		}
		a.failures.WithLabelValues("throttled").Inc()
		a.refuse(w, res.RetryAfter)
		return authThrottled
	}
	if bearer && tokenEqual(strings.TrimSpace(tok), a.token) {
		return authAdmin
	}
	a.failures.WithLabelValues("bad_token").Inc()
	// The context may be cancelled by now; the failure counts anyway.
	_, _ = a.store.Take(context.WithoutCancel(r.Context()), client, authFailLimit, 1)
	w.Header().Set("WWW-Authenticate", `Bearer realm="weir admin"`)
	writeError(w, http.StatusUnauthorized, codeUnauthorized,
		"the admin API needs Authorization: Bearer <token>, the token in the environment variable %s", env)
	return authBad
}

func (a *adminAuth) refuse(w http.ResponseWriter, after time.Duration) {
	secs := int64(math.Ceil(after.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	writeError(w, http.StatusTooManyRequests, codeAuthThrottled,
		"too many failed admin token attempts from this address: no attempt is accepted for %ds", max(secs, 1))
}

// tokenEqual compares tokens in constant time, on hashes so that not even
// their lengths leak.
func tokenEqual(got, want string) bool {
	x, y := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

// clientKey is the failure counter's key for a peer address: the IPv4
// address, or the /64 of an IPv6 one (one host owns a /64). It is the TCP
// peer, never a forwarded header, which the client could write.
func clientKey(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return "?"
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// normalizeAdminToken trims the configured admin token: a secret mounted
// from a file or set with `echo` ends in a newline that no client sends.
func normalizeAdminToken(tok string) string { return strings.TrimSpace(tok) }

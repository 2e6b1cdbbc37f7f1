package server

import (
	"net/http"
	"sort"
	"strings"

	"github.com/weir-dev/weir/internal/server/dashboard"
)

// methods dispatches a path's handlers by method, answering 405 with a
// JSON error and an Allow header for the others. GET also serves HEAD.
type methods map[string]http.HandlerFunc

func (m methods) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, ok := m[r.Method]
	if !ok && r.Method == http.MethodHead {
		h, ok = m[http.MethodGet]
	}
	if !ok {
		allow := make([]string, 0, len(m))
		for k := range m {
			allow = append(allow, k)
		}
		sort.Strings(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, codeMethod, "%s is not allowed on %s; use %s", r.Method, r.URL.Path, strings.Join(allow, " or "))
		return
	}
	h(w, r)
}

// route is one path weir serve answers: Pattern is its ServeMux
// pattern; Handler serves it. Methods lists the methods it answers, or is
// nil for a path that takes any method (GET stands for them in the API
// reference). GET also serves HEAD.
type route struct {
	Pattern string
	Methods []string
	Handler http.Handler
}

// byMethod builds a route of the handlers m dispatches by method.
func byMethod(pattern string, m methods) route {
	ms := make([]string, 0, len(m))
	for k := range m {
		ms = append(ms, k)
	}
	sort.Strings(ms)
	return route{Pattern: pattern, Methods: ms, Handler: m}
}

// routeTable lists every route the server registers, in the order they
// are registered. The API reference (openapi.json) documents each of them;
// a test holds the two to the same list.
func (s *Server) routeTable() []route {
	return []route{
		byMethod("/v1/check", methods{http.MethodPost: s.traced("weir.check", s.handleCheck)}),
		byMethod("/v1/reserve", methods{http.MethodPost: s.traced("weir.reserve", s.handleReserve)}),
		byMethod("/v1/settle", methods{http.MethodPost: s.traced("weir.settle", s.handleSettle)}),
		// Any method: nginx's auth subrequest has the original request's.
		{Pattern: "/v1/auth", Handler: s.traced("weir.auth", s.handleAuth)},
		byMethod("/v1/state", methods{http.MethodGet: s.admin(s.handleStateGet), http.MethodDelete: s.admin(s.handleStateDelete)}),
		byMethod("/v1/blocked", methods{http.MethodGet: s.admin(s.handleBlockedGet), http.MethodDelete: s.admin(s.handleBlockedDelete)}),
		byMethod("/v1/rules", methods{
			http.MethodGet:    s.handleRulesGet,
			http.MethodPut:    s.admin(s.handleRulesPut),
			http.MethodDelete: s.admin(s.handleRulesDelete),
		}),
		byMethod("/v1/overrides", methods{
			http.MethodGet:    s.admin(s.handleOverrideGet),
			http.MethodPut:    s.admin(s.handleOverridePut),
			http.MethodDelete: s.admin(s.handleOverrideDelete),
		}),
		byMethod("/v1/overrides/audit", methods{http.MethodGet: s.admin(s.handleOverrideAudit)}),
		byMethod("/v1/usage", methods{http.MethodGet: s.admin(s.handleUsage)}),
		byMethod("/v1/events", methods{http.MethodGet: s.admin(s.handleEvents)}),
		byMethod("/v1/top", methods{http.MethodGet: s.handleTop}),
		byMethod("/v1/spend", methods{http.MethodGet: s.admin(s.handleSpend)}),
		byMethod("/v1/dashboard/snapshot", methods{http.MethodGet: s.handleSnapshot}),
		byMethod("/openapi.json", methods{http.MethodGet: handleOpenAPI}),
		byMethod("/metrics", methods{http.MethodGet: s.metrics.handler().ServeHTTP}),
		byMethod("/healthz", methods{http.MethodGet: s.handleHealthz}),
		byMethod("/readyz", methods{http.MethodGet: s.handleReadyz}),
		byMethod("/healthz/store", methods{http.MethodGet: s.handleStoreHealth}),
		// envoyproxy/ratelimit's health check, for its probes: any method,
		// as upstream's.
		{Pattern: "/healthcheck", Handler: http.HandlerFunc(s.handleHealthcheck)},
		// The dashboard: its page and assets (the handler answers the
		// other methods itself).
		{Pattern: "/", Methods: []string{http.MethodGet}, Handler: dashboard.Handler()},
	}
}

// routes builds the HTTP handler: the routes of routeTable, and a JSON
// 404 for any other path under /v1/.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routeTable() {
		mux.Handle(rt.Pattern, rt.Handler)
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, "no endpoint %s; see GET /v1/rules, POST /v1/check, GET /v1/auth", r.URL.Path)
	})
	return mux
}

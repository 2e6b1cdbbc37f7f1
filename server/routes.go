package server

import (
	"net/http"
	"sort"
	"strings"

	"github.com/weir-dev/weir/server/dashboard"
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

// routes builds the HTTP handler.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/check", methods{http.MethodPost: s.traced("weir.check", s.handleCheck)})
	mux.Handle("/v1/reserve", methods{http.MethodPost: s.traced("weir.reserve", s.handleReserve)})
	mux.Handle("/v1/settle", methods{http.MethodPost: s.traced("weir.settle", s.handleSettle)})
	// Any method: nginx's auth subrequest has the original request's.
	mux.HandleFunc("/v1/auth", s.traced("weir.auth", s.handleAuth))
	mux.Handle("/v1/state", methods{http.MethodGet: s.admin(s.handleStateGet), http.MethodDelete: s.admin(s.handleStateDelete)})
	mux.Handle("/v1/blocked", methods{http.MethodGet: s.admin(s.handleBlockedGet), http.MethodDelete: s.admin(s.handleBlockedDelete)})
	mux.Handle("/v1/rules", methods{
		http.MethodGet:    s.handleRulesGet,
		http.MethodPut:    s.admin(s.handleRulesPut),
		http.MethodDelete: s.admin(s.handleRulesDelete),
	})
	mux.Handle("/v1/top", methods{http.MethodGet: s.handleTop})
	mux.Handle("/v1/dashboard/snapshot", methods{http.MethodGet: s.handleSnapshot})
	mux.Handle("/metrics", methods{http.MethodGet: s.metrics.handler().ServeHTTP})
	mux.Handle("/healthz", methods{http.MethodGet: s.handleHealthz})
	mux.Handle("/readyz", methods{http.MethodGet: s.handleReadyz})
	mux.Handle("/healthz/store", methods{http.MethodGet: s.handleStoreHealth})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, "no endpoint %s; see GET /v1/rules, POST /v1/check, GET /v1/auth", r.URL.Path)
	})
	mux.Handle("/", dashboard.Handler())
	return mux
}

package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// apiDoc is the loaded and validated openapi.json, with the router that
// matches requests to its operations.
var apiDoc struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

// loadAPIDoc loads openapi.json once, validating it as an OpenAPI
// document. Its servers are dropped so that the router matches the test
// servers' addresses.
func loadAPIDoc(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	apiDoc.once.Do(func() {
		openapi3filter.RegisterBodyDecoder("application/problem+json", openapi3filter.JSONBodyDecoder)
		doc, err := openapi3.NewLoader().LoadFromData(openAPIDoc)
		if err == nil {
			err = doc.Validate(context.Background())
		}
		if err != nil {
			apiDoc.err = err
			return
		}
		doc.Servers = nil
		apiDoc.doc = doc
		apiDoc.router, apiDoc.err = legacy.NewRouter(doc)
	})
	if apiDoc.err != nil {
		t.Fatalf("openapi.json: %v", apiDoc.err)
	}
	return apiDoc.doc, apiDoc.router
}

// anyMethodPaths are the routes that take any method; the document
// describes them under GET.
var anyMethodPaths = map[string]bool{"/v1/auth": true, "/healthcheck": true}

// validateResponse fails t unless the response to req (status, headers
// and body) is one openapi.json describes for req's operation. A method a
// path does not take must answer the Error shape with 405, a path under
// /v1/ that is no route the Error shape with 404; other paths outside the
// document are the dashboard's assets and are not checked.
func validateResponse(t testing.TB, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	if err := responseMismatch(t, req, resp, body); err != nil {
		t.Error(err)
	}
}

// responseMismatch is validateResponse's check: nil when openapi.json
// describes the response, else what it does not describe.
func responseMismatch(t testing.TB, req *http.Request, resp *http.Response, body []byte) error {
	t.Helper()
	doc, router := loadAPIDoc(t)
	rq := req.Clone(context.Background())
	if anyMethodPaths[rq.URL.Path] {
		rq.Method = http.MethodGet
	}
	route, params, err := router.FindRoute(rq)
	if err != nil {
		var want int
		switch reason := routeReason(err); {
		case reason == routers.ErrMethodNotAllowed.Error():
			want = http.StatusMethodNotAllowed
		case reason == routers.ErrPathNotFound.Error() && strings.HasPrefix(rq.URL.Path, "/v1/"):
			want = http.StatusNotFound
		case reason == routers.ErrPathNotFound.Error():
			return nil
		default:
			return fmt.Errorf("openapi.json: %s %s: %v", req.Method, req.URL.Path, err)
		}
		if resp.StatusCode != want {
			return fmt.Errorf("openapi.json: %s %s answered %d; a request outside the document must answer %d", req.Method, req.URL.Path, resp.StatusCode, want)
		}
		if req.Method == http.MethodHead {
			return nil
		}
		v, derr := openapi3filter.JSONBodyDecoder(bytes.NewReader(body), nil, nil, nil)
		if derr == nil {
			derr = doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020())
		}
		if derr != nil {
			return fmt.Errorf("openapi.json: %s %s answered %d with a body that is not an Error: %v\n%s", req.Method, req.URL.Path, resp.StatusCode, derr, body)
		}
		return nil
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: rq, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("openapi.json: %s %s answered %d, which the document does not describe: %v\nbody: %s", req.Method, req.URL.RequestURI(), resp.StatusCode, err, bytes.TrimSpace(body))
	}
	return nil
}

// routeReason is the reason of a router's error (the router answers
// copies of routers.ErrPathNotFound and ErrMethodNotAllowed).
func routeReason(err error) string {
	var re *routers.RouteError
	if errors.As(err, &re) {
		return re.Reason
	}
	return err.Error()
}

// TestOpenAPIDocumentsEveryRoute holds openapi.json and the routes the
// server registers to the same list: every path and method registered is
// documented, and the document has nothing the server does not serve.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc, _ := loadAPIDoc(t)
	s, _ := newTestServer(t)
	registered := map[string][]string{}
	for _, rt := range s.routeTable() {
		ms := rt.Methods
		if ms == nil {
			if !anyMethodPaths[rt.Pattern] {
				t.Errorf("route %s takes any method but is not in anyMethodPaths", rt.Pattern)
			}
			ms = []string{http.MethodGet}
		}
		registered[rt.Pattern] = ms
	}
	for path, ms := range registered {
		item := doc.Paths.Value(path)
		if item == nil {
			t.Errorf("route %s is registered but not in openapi.json", path)
			continue
		}
		var documented []string
		for m := range item.Operations() {
			documented = append(documented, m)
		}
		sort.Strings(documented)
		if !slices.Equal(documented, ms) {
			t.Errorf("route %s: registered for %v, documented for %v", path, ms, documented)
		}
	}
	for _, path := range doc.Paths.InMatchingOrder() {
		if _, ok := registered[path]; !ok {
			t.Errorf("openapi.json documents %s, which the server does not register", path)
		}
	}
}

// TestOpenAPIServed: GET /openapi.json answers the document, without a
// token, and the answer validates like every other.
func TestOpenAPIServed(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken("s3cret"))
	resp, body := call(t, http.MethodGet, ts.URL+"/openapi.json", "")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, openAPIDoc) {
		t.Fatalf("GET /openapi.json: %d, %d bytes; want 200 and the %d bytes of openapi.json", resp.StatusCode, len(body), len(openAPIDoc))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

// TestAPIDocCoversOpenAPI: docs/api.md, the reference people read, has a
// heading for every operation of openapi.json ("### `GET /v1/top`").
func TestAPIDocCoversOpenAPI(t *testing.T) {
	doc, _ := loadAPIDoc(t)
	md, err := os.ReadFile(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for line := range strings.Lines(string(md)) {
		if h, ok := strings.CutPrefix(strings.TrimSpace(line), "### `"); ok {
			headings[strings.TrimSuffix(h, "`")] = true
		}
	}
	for _, path := range doc.Paths.InMatchingOrder() {
		for method := range doc.Paths.Value(path).Operations() {
			if op := method + " " + path; !headings[op] {
				t.Errorf("docs/api.md has no heading ### `%s`", op)
			}
		}
	}
}

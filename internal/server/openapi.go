package server

import (
	_ "embed"
	"net/http"
)

// openAPIDoc is the API reference of weir serve's HTTP API, an OpenAPI
// 3.1 document. docs/api.md renders it for people; the server package's
// tests validate every response they receive against it.
//
//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the OpenAPI 3.1 document of the HTTP API, as served at
// GET /openapi.json.
func OpenAPI() []byte { return append([]byte(nil), openAPIDoc...) }

// handleOpenAPI serves GET /openapi.json: public, like the dashboard.
func handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Access-Control-Allow-Origin", "*")
	_, _ = w.Write(openAPIDoc)
}

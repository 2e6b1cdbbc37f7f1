package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/policy"
)

// tourConfig has a rule of every kind the responses describe: a penalty
// box, a shadow rule, tiers, a daily window with events, a budget and a
// protect rule.
const tourConfig = `
store: {timeout: 10s}
prices:
  currency: EUR
  models:
    gpt-4o: {input: 2.50, output: 10}
events:
  secret_env: HOOK_SECRET
  thresholds: [0.5, 1.0]
rules:
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 3/m
    algorithm: sliding_log
    block: 1m
  - name: daily
    match: { path: /api/ }
    identity: [header:X-API-Key]
    limit: 2/d
    algorithm: fixed_window
    events:
      webhook: %s
  - name: trial
    match: { path: /trial }
    limit: 1/d
    algorithm: fixed_window
    shadow: true
  - name: tiered
    match: { path: /tiered }
    identity: [header:X-Key]
    tiers:
      by: header:X-Plan
      default: { limit: 2/m, algorithm: gcra }
      pro: { limit: 10/m, algorithm: gcra }
  - name: monthly
    identity: [header:X-Key]
    budget: 25 EUR/month
protect:
  - name: checks
    match: {path: /v1/check}
    concurrency: 50
`

// TestOpenAPITour calls every operation of openapi.json on one server
// whose rules fill every part of the answers (a blocked key, tiers, a
// shadow rule, a budget, events, overrides, Envoy rules, protect rules),
// so that each answer is validated against the document with its
// optional parts present. It then proves the schemas closed: each JSON
// answer, with a field added to any of its objects, must no longer
// validate, so a field the server adds or renames without the document
// fails here. An operation the tour does not answer with 2xx fails it.
func TestOpenAPITour(t *testing.T) {
	doc, router := loadAPIDoc(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer hook.Close()
	ecfg, err := envoyrls.Parse([]byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
`), "edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := func(k string) (string, bool) { return "hook-secret", k == "HOOK_SECRET" }
	_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(tourConfig, hook.URL))), WithAdminToken(token),
		WithLookupEnv(env), WithEnvoyConfig(ecfg))
	base := ts.URL
	adm := bearer(token)
	jsonCT := []string{"Content-Type", "application/json"}

	type answer struct {
		req    *http.Request
		resp   *http.Response
		body   []byte
		op     string
		status int
	}
	var answers []answer
	do := func(method, path, body string, header ...string) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, base+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		validateResponse(t, req, resp, b)
		op := ""
		rq := req.Clone(req.Context())
		if anyMethodPaths[rq.URL.Path] {
			rq.Method = http.MethodGet
		}
		if route, _, err := router.FindRoute(rq); err == nil {
			op = rq.Method + " " + route.Path
		}
		answers = append(answers, answer{req, resp, b, op, resp.StatusCode})
		return resp.StatusCode, b
	}
	want := func(got int, b []byte, status int, what string) {
		t.Helper()
		if got != status {
			t.Fatalf("%s: %d %s; want %d", what, got, b, status)
		}
	}

	// Decisions: allowed, refused, a penalty box, a tier, a shadow rule.
	for i, st := range []int{200, 200, 429} {
		got, b := do("POST", "/v1/check", `{"rule":"daily","key":"alice"}`, jsonCT...)
		want(got, b, st, fmt.Sprintf("check %d", i))
	}
	for range 4 {
		do("POST", "/v1/check", `{"rule":"login","key":"10.0.0.9"}`, jsonCT...)
	}
	got, b := do("POST", "/v1/check", `{"rule":"tiered","key":"k","tier":"pro"}`, jsonCT...)
	want(got, b, 200, "tiered check")
	do("POST", "/v1/check", `{"rule":"trial","key":"k"}`, jsonCT...)
	got, b = do("POST", "/v1/check", `{"rule":"trial","key":"k"}`, jsonCT...)
	if want(got, b, 200, "shadow check"); !bytes.Contains(b, []byte(`"shadow_limited":true`)) {
		t.Fatalf("shadow check: %s", b)
	}
	envoyBody := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}`
	got, b = do("POST", "/v1/check", envoyBody, jsonCT...)
	want(got, b, 200, "Envoy check")
	got, b = do("POST", "/v1/check", envoyBody, jsonCT...)
	want(got, b, 429, "Envoy check over the limit")
	// Reservations: one kept and settled, one past the budget.
	got, b = do("POST", "/v1/reserve", `{"rule":"monthly","key":"k","estimate":2000000}`, jsonCT...)
	want(got, b, 200, "reserve")
	var rsv struct{ Reservation string }
	if err := json.Unmarshal(b, &rsv); err != nil || rsv.Reservation == "" {
		t.Fatalf("reserve: %s", b)
	}
	got, b = do("POST", "/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":1234567}`, rsv.Reservation), jsonCT...)
	want(got, b, 200, "settle")
	got, b = do("POST", "/v1/reserve", `{"rule":"monthly","key":"k","estimate":24000000}`, jsonCT...)
	want(got, b, 429, "reserve past the budget")
	// nginx's auth subrequest, allowed and refused.
	authHdr := []string{"X-Original-URI", "/api/items", "X-Original-Method", "GET", "X-API-Key", "bob"}
	for i, st := range []int{200, 200, 403, 429} {
		path := "/v1/auth"
		if st == 429 {
			path += "?status=429"
		}
		got, b = do("GET", path, "", authHdr...)
		want(got, b, st, fmt.Sprintf("auth %d", i))
	}

	// The admin API, with something in every list.
	got, b = do("GET", "/v1/state?rule=daily&key=alice", "", adm...)
	want(got, b, 200, "state")
	got, b = do("DELETE", "/v1/state?rule=daily&key=alice", "", adm...)
	want(got, b, 200, "reset")
	got, b = do("GET", "/v1/blocked", "", adm...)
	if want(got, b, 200, "blocked"); !bytes.Contains(b, []byte("10.0.0.9")) {
		t.Fatalf("blocked lists no key: %s", b)
	}
	got, b = do("DELETE", "/v1/blocked?rule=login&key=10.0.0.9", "", adm...)
	want(got, b, 200, "unblock")
	got, b = do("PUT", "/v1/overrides", `{"rule":"daily","key":"alice","limit":"9/d","until":"2099-01-01T00:00:00Z","note":"a trial"}`, append(adm, jsonCT...)...)
	want(got, b, 200, "override")
	got, b = do("GET", "/v1/overrides?rule=daily", "", adm...)
	want(got, b, 200, "overrides")
	got, b = do("GET", "/v1/usage?rule=daily&key=alice", "", adm...)
	want(got, b, 200, "usage with an override")
	got, b = do("GET", "/v1/usage?rule=monthly&key=k", "", adm...)
	want(got, b, 200, "usage of a budget")
	got, b = do("DELETE", "/v1/overrides?rule=daily&key=alice", "", adm...)
	want(got, b, 200, "override deleted")
	got, b = do("GET", "/v1/overrides/audit", "", adm...)
	want(got, b, 200, "audit")
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, b = do("GET", "/v1/events", "", adm...)
		want(got, b, 200, "events")
		if bytes.Contains(b, []byte(`"daily"`)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !bytes.Contains(b, []byte(`"daily"`)) {
		t.Fatalf("no event of rule daily: %s", b)
	}
	got, b = do("GET", "/v1/top", "", adm...)
	want(got, b, 200, "top")
	got, b = do("GET", "/v1/top?rule=daily&n=3", "", adm...)
	want(got, b, 200, "top of a rule")
	got, b = do("GET", "/v1/spend?rule=monthly", "", adm...)
	want(got, b, 200, "spend")
	got, b = do("GET", "/v1/dashboard/snapshot", "", adm...)
	want(got, b, 200, "snapshot")
	got, b = do("GET", "/v1/dashboard/snapshot", "")
	want(got, b, 200, "redacted snapshot")
	got, b = do("GET", "/v1/rules", "")
	if want(got, b, 200, "rules"); !bytes.Contains(b, []byte(`"envoy"`)) {
		t.Fatalf("rules without the Envoy rules: %s", b)
	}
	got, b = do("PUT", "/v1/rules", "rules:\n  - {name: only, limit: 3/m}\n", adm...)
	want(got, b, 200, "rules replaced")
	got, b = do("DELETE", "/v1/rules", "", adm...)
	want(got, b, 200, "rules restored")
	for _, p := range []string{"/openapi.json", "/metrics", "/healthz", "/readyz", "/healthz/store", "/healthcheck", "/"} {
		got, b = do("GET", p, "")
		want(got, b, 200, p)
	}

	// Errors, each in the Error shape.
	do("POST", "/v1/check", `{"rule":"nope","key":"k"}`, jsonCT...)
	do("POST", "/v1/check", `{"rule":"daily"}`, jsonCT...)
	do("GET", "/v1/usage?rule=daily&key=alice", "")
	do("PUT", "/v1/rules", "rules: [{name: bad, limit: lots}]\n", adm...)
	do("POST", "/v1/settle", `{"reservation":"nope","actual":1}`, jsonCT...)
	do("PATCH", "/v1/rules", "")
	do("GET", "/v1/nope", "")

	// Every operation answered 2xx at least once.
	ok := map[string]bool{}
	for _, a := range answers {
		if a.status/100 == 2 {
			ok[a.op] = true
		}
	}
	var missing []string
	for _, path := range doc.Paths.InMatchingOrder() {
		for method := range doc.Paths.Value(path).Operations() {
			if !ok[method+" "+path] {
				missing = append(missing, method+" "+path)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the tour answered no 2xx for %v: add a call to it", missing)
	}

	// The schemas are closed: an undocumented field anywhere fails.
	for _, a := range answers {
		ct := a.resp.Header.Get("Content-Type")
		if a.op == "GET /openapi.json" || !strings.Contains(ct, "json") || len(a.body) == 0 {
			continue
		}
		var v any
		if err := json.Unmarshal(a.body, &v); err != nil {
			t.Errorf("%s %s: %v", a.req.Method, a.req.URL.RequestURI(), err)
			continue
		}
		for _, where := range objectPaths(v, nil) {
			mutated := withField(v, where)
			mb, _ := json.Marshal(mutated)
			if responseMismatch(t, a.req, a.resp, mb) == nil {
				t.Errorf("%s %s answered %d: openapi.json accepts an undocumented field in the object at %q; close its schema (additionalProperties: false)",
					a.req.Method, a.req.URL.RequestURI(), a.status, "/"+strings.Join(where, "/"))
			}
		}
	}
}

// objectPaths lists the JSON objects in v by their paths (keys, and 0 for
// an array's first element; none for v itself), the first element of each
// array only.
func objectPaths(v any, at []string) [][]string {
	var out [][]string
	switch x := v.(type) {
	case map[string]any:
		out = append(out, at)
		for k, e := range x {
			out = append(out, objectPaths(e, append(slices.Clip(at), k))...)
		}
	case []any:
		if len(x) > 0 {
			out = append(out, objectPaths(x[0], append(slices.Clip(at), "0"))...)
		}
	}
	return out
}

// withField is a deep copy of v with the field "undocumented": true added
// to the object at path where.
func withField(v any, where []string) any {
	b, _ := json.Marshal(v)
	var c any
	_ = json.Unmarshal(b, &c)
	node := c
	for _, k := range where {
		switch x := node.(type) {
		case map[string]any:
			node = x[k]
		case []any:
			node = x[0]
		}
	}
	node.(map[string]any)["undocumented"] = true
	return c
}

// TestOpenAPISchemasMatchGoTypes holds the schemas of openapi.json to
// the Go types the server encodes: every JSON field of the type is a
// property of its schema and the other way round, a field without
// omitempty is required and one with it is not, and the JSON types agree,
// into nested objects, arrays and maps. A field added, renamed, made
// optional or retyped in Go fails here even if no test's answer has it.
func TestOpenAPISchemasMatchGoTypes(t *testing.T) {
	doc, _ := loadAPIDoc(t)
	sc := doc.Components.Schemas
	inline := func(path, method, status string) *openapi3.Schema {
		t.Helper()
		op := doc.Paths.Value(path).GetOperation(method)
		return op.Responses.Status(mustAtoi(t, status)).Value.Content.Get("application/json").Schema.Value
	}
	for _, c := range []struct {
		name   string
		schema *openapi3.Schema
		typ    reflect.Type
	}{
		{"Decision", sc["Decision"].Value, reflect.TypeFor[CheckAnswer]()},
		{"Reservation", sc["Reservation"].Value, reflect.TypeFor[reserveDecision]()},
		{"BlockedEntry", sc["BlockedEntry"].Value, reflect.TypeFor[BlockedEntry]()},
		{"TopEntry", sc["TopEntry"].Value, reflect.TypeFor[TopEntry]()},
		{"StoreHealth", sc["StoreHealth"].Value, reflect.TypeFor[storeHealth]()},
		{"Snapshot", sc["Snapshot"].Value, reflect.TypeFor[Snapshot]()},
		{"Rule", sc["Rule"].Value, reflect.TypeFor[policy.RuleInfo]()},
		{"Override", sc["Override"].Value, reflect.TypeFor[overrideJSON]()},
		{"OverrideChange", sc["OverrideChange"].Value, reflect.TypeFor[changeJSON]()},
		{"Usage", sc["Usage"].Value, reflect.TypeFor[usageJSON]()},
		{"Event", sc["Event"].Value, reflect.TypeFor[events.Event]()},
		{"GET /v1/rules envoy", inline("/v1/rules", "GET", "200").Properties["envoy"].Value.Items.Value, reflect.TypeFor[envoyRuleInfo]()},
		{"GET /v1/spend top", inline("/v1/spend", "GET", "200").Properties["top"].Value.Items.Value, reflect.TypeFor[spendEntry]()},
	} {
		matchSchema(t, c.name, c.schema, c.typ)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// jsonFields lists a struct's JSON fields as encoding/json encodes them,
// embedded structs flattened.
func jsonFields(typ reflect.Type) []reflect.StructField {
	var out []reflect.StructField
	for f := range typ.Fields() {
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		out = append(out, f)
	}
	return out
}

// matchSchema fails t where schema s does not describe what
// encoding/json writes for typ.
func matchSchema(t *testing.T, where string, s *openapi3.Schema, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	// A nullable reference ({oneOf: [{$ref}, {type: null}]}): the
	// reference describes the value.
	var branches []*openapi3.Schema
	for _, b := range append(slices.Clone(s.OneOf), s.AnyOf...) {
		if b.Value.Type == nil || !b.Value.Type.Is("null") {
			branches = append(branches, b.Value)
		}
	}
	if len(branches) == 1 {
		matchSchema(t, where, branches[0], typ)
		return
	}
	is := func(want string) bool {
		if s.Type == nil {
			// const or enum only: judged by its values.
			return s.Const != nil || len(s.Enum) > 0
		}
		return s.Type.Includes(want)
	}
	switch {
	case typ == reflect.TypeFor[time.Time]():
		if !is("string") {
			t.Errorf("%s: a time; the schema's type is %v", where, s.Type)
		}
	case typ.Kind() == reflect.Struct:
		if !is("object") {
			t.Errorf("%s: an object; the schema's type is %v", where, s.Type)
		}
		if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has {
			t.Errorf("%s: a Go struct; its schema must say additionalProperties: false", where)
		}
		required := map[string]bool{}
		for _, r := range s.Required {
			required[r] = true
		}
		seen := map[string]bool{}
		for _, f := range jsonFields(typ) {
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			seen[name] = true
			p := s.Properties[name]
			if p == nil {
				t.Errorf("%s: the Go field %s is written as %q, which the schema does not list", where, f.Name, name)
				continue
			}
			omit := strings.Contains(opts, "omitempty") || strings.Contains(opts, "omitzero")
			if !omit && !required[name] {
				t.Errorf("%s.%s: always written (no omitempty), so the schema must require it", where, name)
			}
			if omit && required[name] {
				t.Errorf("%s.%s: omitempty, so the schema must not require it", where, name)
			}
			matchSchema(t, where+"."+name, p.Value, f.Type)
		}
		for name := range s.Properties {
			if !seen[name] {
				t.Errorf("%s: the schema lists %q, which the Go type %s does not write", where, name, typ)
			}
		}
	case typ.Kind() == reflect.Slice:
		if !is("array") {
			t.Errorf("%s: an array; the schema's type is %v", where, s.Type)
		} else if s.Items != nil {
			matchSchema(t, where+"[]", s.Items.Value, typ.Elem())
		}
	case typ.Kind() == reflect.Map:
		if !is("object") || s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: a map; the schema must be an object with additionalProperties a schema", where)
		} else {
			matchSchema(t, where+"{}", s.AdditionalProperties.Schema.Value, typ.Elem())
		}
	case typ.Kind() == reflect.String:
		if !is("string") {
			t.Errorf("%s: a string; the schema's type is %v", where, s.Type)
		}
	case typ.Kind() == reflect.Bool:
		if !is("boolean") {
			t.Errorf("%s: a boolean; the schema's type is %v", where, s.Type)
		}
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		if !is("integer") {
			t.Errorf("%s: an integer; the schema's type is %v", where, s.Type)
		}
	case typ.Kind() == reflect.Float32 || typ.Kind() == reflect.Float64:
		if !is("number") {
			t.Errorf("%s: a number; the schema's type is %v", where, s.Type)
		}
	}
}

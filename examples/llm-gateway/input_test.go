package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// errorMessage returns the message of an OpenAI-style error body.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error.Message
}

// TestAPIKeyIsCanonical: the scheme's case and the spaces around it do not
// make another budget; the key's case does; x-api-key is the same key; a
// malformed key header is a 401 that does not echo the key.
func TestAPIKeyIsCanonical(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	x := knobs{In: 10, Out: 10}
	c := costOf("gpt-t", x)
	b := body("gpt-t", 10, x, "")
	for i, hdr := range [][]string{
		{"Authorization", "Bearer sk-Same"}, {"Authorization", "bearer sk-Same"},
		{"Authorization", "BEARER \t sk-Same"}, {"X-Api-Key", "sk-Same"},
	} {
		if status, resp, _ := g.do(chatPath, "", b, hdr...); status != 200 {
			t.Fatalf("%q: %d %s", hdr, status, resp)
		}
		if got := g.keyLeft("sk-Same"); got != keyBudget-int64(i+1)*c {
			t.Fatalf("%q: left %d, want one budget", hdr, got)
		}
	}
	if status, _, _ := g.do(chatPath, "SK-SAME", b); status != 200 || g.keyLeft("SK-SAME") != keyBudget-c {
		t.Fatalf("another key (its case differs): %d", status)
	}
	for _, c := range []struct {
		hdr  []string
		want string
	}{
		{[]string{"Authorization", "Bearer"}, "no space"},
		{[]string{"Authorization", "sk-secret-1"}, "no space"},
		{[]string{"Authorization", "Basic sk-secret-1"}, `"Basic" is not Bearer`},
		{[]string{"Authorization", "Bearer sk-secret-1 sk-secret-2"}, `' ' at byte 11`},
		{[]string{"Authorization", "Bearer =="}, "empty"},
		{[]string{"Authorization", "Bearer sk-a", "Authorization", "Bearer sk-b"}, "2 Authorization headers"},
		{[]string{"Authorization", "Bearer sk-secret", "X-Api-Key", "sk-secret"}, "both Authorization and x-api-key"},
		{[]string{"X-Api-Key", "sk-secret,1"}, `x-api-key has ',' at byte 9`},
		{nil, "no API key"},
	} {
		status, resp, h := g.do(chatPath, "", b, c.hdr...)
		if status != 401 || !strings.Contains(errorMessage([]byte(resp)), c.want) || strings.Contains(resp, "secret") || h.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("%q: %d %q, want 401 naming %s", c.hdr, status, resp, c.want)
		}
	}
	// A client's own X-Weir-Key is dropped: no key, no request.
	if status, _, _ := g.do(chatPath, "", b, keyHeader, keyID("sk-victim")); status != 401 || g.keyLeft("sk-victim") != keyBudget {
		t.Fatalf("a client's own X-Weir-Key: %d", status)
	}
}

// TestBadRequests: a request whose cost cannot be bounded is a 400 naming
// the value, and nothing is taken; other paths pass through unmetered.
func TestBadRequests(t *testing.T) {
	up := newFakeUpstream(t)
	g := newTestGateway(t, up, "", nil, time.Minute)
	for _, c := range []struct{ path, body, want string }{
		{chatPath, `{"model":"gpt-t","messages":[]}`, "max_tokens (or max_completion_tokens) is required"},
		{messagesPath, `{"model":"claude-t","max_completion_tokens":5,"messages":[]}`, "max_tokens is required"},
		{chatPath, `{"model":"gpt-t","max_tokens":null,"messages":[]}`, "max_tokens (or max_completion_tokens) is required"},
		{chatPath, `{"model":"gpt-t","max_tokens":-1,"messages":[]}`, "max_tokens is -1"},
		{chatPath, `{"model":"gpt-t","max_tokens":1.5,"messages":[]}`, "max_tokens is 1.5"},
		{messagesPath, `{"model":"claude-t","max_tokens":"100","messages":[]}`, `max_tokens is "100"`},
		{chatPath, `{"model":"gpt-t","max_completion_tokens":true,"messages":[]}`, "max_completion_tokens is true"},
		{chatPath, `{"model":"gpt-t","max_tokens":10,"n":0,"messages":[]}`, "n is 0"},
		{chatPath, `{"model":"gpt-t","max_tokens":10,"n":129,"messages":[]}`, "n is 129"},
		{chatPath, `{"max_tokens":10,"messages":[]}`, "model is null"},
		{messagesPath, `{"model":7,"max_tokens":10,"messages":[]}`, "model is 7"},
		{chatPath, `{"model":"gpt-t","max_tokens":8000,"n":128,"messages":[]}`, "more than the budget can ever admit"},
		{chatPath, `not json`, "not a JSON object"},
		{messagesPath, `null`, "not a JSON object"},
		{chatPath, `[1]`, "not a JSON object"},
		{chatPath, `{"model":"gpt-t","max_tokens":1} {"model":"o3"}`, "more than one JSON value"},
	} {
		status, resp, _ := g.do(c.path, "sk-bad", c.body)
		if status != 400 || !strings.Contains(errorMessage([]byte(resp)), c.want) {
			t.Errorf("%s %s: %d %s, want 400 naming %s", c.path, c.body, status, resp, c.want)
		}
	}
	if got := g.keyLeft("sk-bad"); got != keyBudget {
		t.Fatalf("refused requests counted: %d left", got)
	}
	for _, path := range []string{"/v1/embeddings", chatPath + "/", "/v1/messages/batches", "/v1/responses"} {
		status, resp, _ := g.do(path, "sk-bad", `{"x":{"status":418}}`)
		if status != 404 || !strings.Contains(errorMessage([]byte(resp)), "not POST "+path) {
			t.Errorf("POST %s: %d %s, want 404", path, status, resp)
		}
	}
	req, _ := http.NewRequest("GET", g.url+"/v1/models", nil)
	resp, err := g.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 { // the fake upstream answers 400 to a GET's empty body: it went upstream
		t.Fatalf("GET /v1/models: %d", resp.StatusCode)
	}
	if g.keyLeft("sk-bad") != keyBudget {
		t.Fatalf("refused requests counted: %d left", g.keyLeft("sk-bad"))
	}
}

// TestUsageScanner: the scanner finds a top-level usage (and Anthropic's
// in a top-level message) however the JSON is cut into pieces, and
// ignores "usage" in strings and in other nested objects.
func TestUsageScanner(t *testing.T) {
	type u = [5]int64 // input, cached, output, reasoning, cache writes
	for _, c := range []struct {
		api   api
		in    string
		found bool
		want  u
	}{
		{openAI, `{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":4}}`, true, u{10, 0, 4, 0, 0}},
		{openAI, `{"usage":{"prompt_tokens":10,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":6},"completion_tokens_details":{"reasoning_tokens":5}}}`, true, u{4, 6, 4, 5, 0}},
		{openAI, `{"usage":{"total_tokens":42}}`, false, u{}},
		{openAI, `{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`, false, u{}},
		{openAI, `{"usage":{"prompt_tokens":-3,"completion_tokens":1}}`, false, u{}},
		{openAI, `{"usage":null}`, false, u{}},
		{openAI, `{"content":"\"usage\":{\"prompt_tokens\":9}","usage" : {"prompt_tokens":5,"completion_tokens":0} }`, true, u{5, 0, 0, 0, 0}},
		{openAI, `{"choices":[{"usage":{"prompt_tokens":9,"completion_tokens":9}}]}`, false, u{}},
		{openAI, `{"message":{"usage":{"prompt_tokens":9,"completion_tokens":9}}}`, false, u{}},
		{openAI, `{"usage":{"prompt_tokens":8,"completion_tokens":1}`, false, u{}}, // cut before the usage ends
		{openAI, `{"usage":null}{"usage":{"prompt_tokens":6,"completion_tokens":1}}`, true, u{6, 0, 1, 0, 0}},
		{anthropic, `{"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":3,"cache_read_input_tokens":20,"output_tokens":7}}`, true, u{10, 20, 7, 0, 3}},
		{anthropic, `{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":10,"cache_read_input_tokens":20,"output_tokens":1}}}`, false, u{10, 20, 1, 0, 0}},
		{anthropic, `{"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":20,"output_tokens":1}}}{"type":"message_delta","usage":{"output_tokens":99}}`, true, u{10, 20, 99, 0, 0}},
		{anthropic, `{"message":{"content":[{"usage":{"output_tokens":5}}],"x":{"usage":{"input_tokens":5}},"message":{"usage":{"input_tokens":6}}}}`, false, u{}},
		{anthropic, `{"message":"usage","usage":{"output_tokens":2}}`, true, u{0, 0, 2, 0, 0}},
		{anthropic, `{"type":"message_delta","usage":{"output_tokens":-1}}`, false, u{}},
	} {
		for _, step := range []int{1, 2, 7, len(c.in)} {
			s := usageScanner{api: c.api}
			for i := 0; i < len(c.in); i += step {
				s.write([]byte(c.in[i:min(i+step, len(c.in))]))
			}
			got := s.usage()
			if s.found != c.found || (u{got.InputTokens, got.CachedInputTokens, got.OutputTokens, got.ReasoningTokens, got.CacheWriteTokens}) != c.want {
				t.Errorf("%s in pieces of %d: found %t %+v, want %t %v", c.in, step, s.found, got, c.found, c.want)
			}
		}
	}
}

// TestTenantsFile: a tenants file maps key hashes to their levels; a bad
// entry is refused naming its index and field, never its hash.
func TestTenantsFile(t *testing.T) {
	h1, h2 := keyID("sk-1"), keyID("sk-2")
	ts, err := parseTenants([]byte(fmt.Sprintf(`{"keys":[{"sha256":%q,"user":"alice","team":"search","org":"acme"},{"sha256":%q,"org":"acme"}]}`, h1, h2)))
	if err != nil || len(ts) != 2 || ts[h1] != (tenant{User: "alice", Team: "search", Org: "acme"}) || ts[h2] != (tenant{Org: "acme"}) {
		t.Fatalf("%v %+v", err, ts)
	}
	for _, c := range []struct{ doc, want string }{
		{`{"keys":[{"sha256":"abc"}]}`, "keys[0].sha256 is not 64 lower-case hex digits"},
		{fmt.Sprintf(`{"keys":[{"sha256":%q}]}`, strings.ToUpper(h1)), "keys[0].sha256 is not 64"},
		{fmt.Sprintf(`{"keys":[{"sha256":%q},{"sha256":%q}]}`, h1, h1), "keys[1].sha256 is listed twice"},
		{fmt.Sprintf(`{"keys":[{"sha256":%q,"team":"a b"}]}`, h1), `keys[0].team "a b" is not 1 to 128 printable ASCII bytes`},
		{fmt.Sprintf(`{"keys":[{"sha256":%q,"org":%q}]}`, h1, strings.Repeat("o", 129)), `keys[0].org`},
		{fmt.Sprintf(`{"keys":[{"sha256":%q,"group":"x"}]}`, h1), `unknown field "group"`},
		{`[]`, "not a tenants file"},
	} {
		_, err := parseTenants([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), h1) {
			t.Errorf("%s: %v, want %s", c.doc, err, c.want)
		}
	}
	var b strings.Builder
	b.WriteString(`{"keys":[`)
	for i := range maxTenants + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sha256":"%064x"}`, i)
	}
	b.WriteString(`]}`)
	if _, err := parseTenants([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than 100000") {
		t.Errorf("too many keys: %v", err)
	}
	path := filepath.Join(t.TempDir(), "tenants.json")
	os.WriteFile(path, []byte(fmt.Sprintf(`{"keys":[{"sha256":%q,"team":"t"}]}`, h1)), 0o600)
	if ts, err := loadTenants(path); err != nil || ts[h1].Team != "t" {
		t.Fatalf("loadTenants: %v %+v", err, ts)
	}
}

// TestEmbeddedRules: the shipped weir.yaml compiles, prices a listed model
// and refuses an unlisted one.
func TestEmbeddedRules(t *testing.T) {
	p, err := newPolicy(nil, memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	up := newFakeUpstream(t)
	u, _ := url.Parse(up.URL)
	h := newGateway(p, nil, u, u, time.Minute, discardLog)
	send := func(b string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", chatPath, strings.NewReader(b))
		r.Header.Set("Authorization", "Bearer sk-e")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// gpt-4o-mini: 0.15 input, 0.075 cached input, 0.60 output per million.
	w := send(body("gpt-4o-mini", 1000, knobs{In: 1000, Cached: 2000, Out: 1000}, ""))
	rr, _ := p.CheckKey(context.Background(), policy.KeyRequest{Rule: "key-budget", Key: keyID("sk-e"), N: 0})
	if w.Code != 200 || rr.Result.Remaining != 5_000_000-(150+150+600) {
		t.Fatalf("gpt-4o-mini: %d %s, left %d", w.Code, w.Body, rr.Result.Remaining)
	}
	if w := send(body("gpt-5-turbo", 10, knobs{}, "")); w.Code != 400 || !strings.Contains(w.Body.String(), `unknown model \"gpt-5-turbo\"`) {
		t.Fatalf("unknown model: %d %s", w.Code, w.Body)
	}
}

// TestPrepareWritesWhatItPriced: the body that goes upstream is the object
// the gateway priced: a key given twice goes up once, with the value the
// estimate used; numbers go up as they came.
func TestPrepareWritesWhatItPriced(t *testing.T) {
	est, out, err := prepare(openAI, []byte(`{"model":"gpt-4o-mini","max_tokens":1,"model":"o3","max_tokens":9000,"seed":12345678901234567890,"temperature":0.7,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if est.Model != "o3" || est.OutputTokens != 9000 || est.InputTokens != int64(len(out)) ||
		strings.Count(s, `"model"`) != 1 || strings.Count(s, `"max_tokens"`) != 1 || !strings.Contains(s, `"model":"o3"`) ||
		!strings.Contains(s, `"max_tokens":9000`) || !strings.Contains(s, `"seed":12345678901234567890`) || !strings.Contains(s, `"stream_options":{"include_usage":true}`) {
		t.Fatalf("%+v %s", est, out)
	}
	est, _, err = prepare(openAI, []byte(`{"model":"m","max_tokens":100,"max_completion_tokens":300,"n":4}`))
	if err != nil || est.OutputTokens != 1200 {
		t.Fatalf("max_completion_tokens × n: %+v %v", est, err)
	}
	est, _, err = prepare(anthropic, []byte(`{"model":"m","max_tokens":100,"n":4}`))
	if err != nil || est.OutputTokens != 100 {
		t.Fatalf("Anthropic has no n: %+v %v", est, err)
	}
}

// Command llm-gateway is a reverse proxy in front of an OpenAI-style chat
// API that limits LLM tokens per minute per API key.
//
//	UPSTREAM=https://api.openai.com go run ./examples/llm-gateway
//	curl localhost:8090/v1/chat/completions -H 'Authorization: Bearer sk-…' \
//	  -d '{"model":"gpt-4o-mini","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}'
//
// It listens on $ADDR (default 127.0.0.1:8090). The rule (the embedded
// weir.yaml) is a token bucket of 10,000 tokens a minute per API key, with
// cost: header:X-Weir-Estimate:
//
//   - the API key is the credential of "Authorization: Bearer KEY": the
//     scheme in any case, any spaces around it, the key byte for byte. The
//     gateway counts by a SHA-256 of the key (X-Weir-Key), never logs it,
//     and answers 401 to an Authorization it cannot read;
//   - before a chat completion goes upstream, the gateway bounds its cost:
//     the request body's size in bytes (the prompt) plus max_tokens (or
//     max_completion_tokens) times n (the completions). A token is at least
//     one byte of its text in every BPE tokenizer in use, and the JSON
//     around the text is longer than the few tokens per message a chat
//     template adds, so a text prompt never counts more tokens than its
//     request has bytes. The rule reserves that bound (at most the whole
//     budget) from X-Weir-Estimate. A chat request without max_tokens, with
//     a max_tokens or n (1 to 128) that is not a whole number in range, or
//     whose max_tokens × n exceeds the budget, gets 400 naming the value;
//   - the response's usage.total_tokens is charged with httplimit.Charge,
//     from a JSON body of any size or from the stream event that carries it
//     (the gateway asks for it with stream_options.include_usage); the
//     middleware then refunds what the reservation did not use, or debits
//     the excess, into debt if need be. A 200 response whose usage cannot
//     be read is charged the whole bound; an error response keeps the
//     reservation;
//   - a client that hangs up does not stop the metering: the gateway reads
//     the rest of the upstream's answer, for at most two minutes, for its
//     usage;
//   - a key in debt, or out of tokens, gets 429 with Retry-After and the
//     RateLimit headers, until the debt is paid back at the rule's rate.
//
// Counting is by the upstream's own usage report: the gateway never
// tokenizes. Images, audio and files cost tokens that their bytes in the
// request do not bound; for those the bound holds only through the
// upstream's usage report.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
)

//go:embed weir.yaml
var rulesYAML []byte

const (
	// ruleName is the rule of weir.yaml that counts tokens.
	ruleName = "llm-tokens"
	// chatPath is the path whose requests the gateway meters.
	chatPath = "/v1/chat/completions"
	// costHeader is the header the rule reads its reservation from.
	costHeader = "X-Weir-Estimate"
	// keyHeader is the header the rule counts by: a hash of the API key.
	keyHeader = "X-Weir-Key"
	// maxBody bounds the request body the gateway reads.
	maxBody = 1 << 20
	// maxN bounds a request's n, the number of completions it asks for.
	maxN = 128
	// maxUsage bounds the bytes of a usage object the gateway keeps.
	maxUsage = 64 << 10
	// drainTimeout bounds how long the gateway reads an upstream answer
	// whose client went away, for its usage.
	drainTimeout = 2 * time.Minute
)

// newPolicy compiles the embedded rules over store (nil: in memory).
func newPolicy(store weir.Store) (*policy.Policy, error) {
	cfg, err := policy.Parse(rulesYAML, "weir.yaml")
	if err != nil {
		return nil, err
	}
	return policy.New(cfg, store)
}

// gateway is the front of the proxy: it reads the caller's API key and
// the request's cost bound before the rule decides.
type gateway struct {
	next    http.Handler
	maxCost int64         // the most the rule admits at once
	drain   time.Duration // how long to read on after a client hangs up
}

// newGateway returns the proxy to upstream under p's rules; drain bounds
// how long it reads an answer whose client went away, for its usage.
func newGateway(p *policy.Policy, upstream *url.URL, drain time.Duration) (http.Handler, error) {
	l, err := p.Limit(ruleName, "")
	if err != nil {
		return nil, err
	}
	params, err := l.Compile()
	if err != nil {
		return nil, err
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Header.Del(costHeader)
			pr.Out.Header.Del(keyHeader)
			// The transport then asks for gzip itself and decompresses, so
			// the meter reads the usage in plain JSON.
			pr.Out.Header.Del("Accept-Encoding")
		},
		ModifyResponse: meterUsage,
		FlushInterval:  -1, // pass stream events on as they come
	}
	return &gateway{next: policy.Middleware(p)(detach(proxy, drain)), maxCost: params.MaxCost(), drain: drain}, nil
}

// ServeHTTP sets X-Weir-Key from the Authorization header and, on a chat
// completion, X-Weir-Estimate from the body; it overwrites whatever the
// client sent in either.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Header.Del(costHeader)
	r.Header.Del(keyHeader)
	if auth := r.Header.Values("Authorization"); len(auth) > 0 {
		key, err := apiKey(auth)
		if err != nil {
			w.Header().Set("WWW-Authenticate", "Bearer")
			fail(w, http.StatusUnauthorized, err.Error())
			return
		}
		r.Header.Set(keyHeader, keyID(key))
	}
	if r.Method == http.MethodPost && r.URL.Path == chatPath && r.Body != nil {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes, or unreadable", maxBody))
			return
		}
		est, out, err := prepare(body, g.maxCost)
		if err != nil {
			fail(w, http.StatusBadRequest, err.Error())
			return
		}
		r.Header.Set(costHeader, strconv.FormatInt(min(est, g.maxCost), 10))
		r = r.WithContext(context.WithValue(r.Context(), estimateKey{}, est))
		r.Body = io.NopCloser(bytes.NewReader(out))
		r.ContentLength = int64(len(out))
	}
	g.next.ServeHTTP(w, r)
}

// fail answers an OpenAI-style error.
func fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}})
	w.Write(append(b, '\n'))
}

// apiKey returns the credential of a "Bearer KEY" Authorization header: the
// scheme in any case, spaces and tabs around and after it ignored, the key
// exact (RFC 6750's token68). Errors never quote the key.
func apiKey(values []string) (string, error) {
	if len(values) > 1 {
		return "", fmt.Errorf("%d Authorization headers; send one", len(values))
	}
	v := strings.Trim(values[0], " \t")
	i := strings.IndexAny(v, " \t")
	if i < 0 {
		return "", errors.New(`the Authorization header must be "Bearer KEY"; it has no space after its scheme`)
	}
	scheme, key := v[:i], strings.TrimLeft(v[i:], " \t")
	if !strings.EqualFold(scheme, "Bearer") {
		if len(scheme) > 32 {
			scheme = scheme[:32] + "…"
		}
		return "", fmt.Errorf("the Authorization scheme %q is not Bearer", scheme)
	}
	end := len(key)
	for end > 0 && key[end-1] == '=' {
		end--
	}
	if end == 0 {
		return "", errors.New("the API key after Bearer is empty")
	}
	for j := 0; j < end; j++ {
		if c := key[j]; !token68(c) {
			return "", fmt.Errorf("the API key after Bearer has %q at byte %d, which a key cannot hold (want letters, digits and -._~+/, then any =)", c, j)
		}
	}
	return key, nil
}

// token68 reports whether c may appear in an RFC 7235 token68 before its
// trailing "=".
func token68(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/'
}

// keyID is what the rule counts an API key by: its SHA-256, in hex.
func keyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// estimateKey carries a request's cost bound in its context, for the
// meter to charge when the response's usage cannot be read.
type estimateKey struct{}

// prepare returns the bound on a chat request's cost and the body to send
// upstream: a streamed request gets stream_options.include_usage. The
// bound is the body's size in bytes (the prompt's tokens cannot exceed it)
// plus max_tokens (or max_completion_tokens, whichever is larger) times n.
// A body that is not a JSON object, a missing or invalid max_tokens or n,
// or completions that the rule could never admit (over maxCost) are
// errors that name the value.
func prepare(body []byte, maxCost int64) (int64, []byte, error) {
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		return 0, nil, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	if req == nil {
		return 0, nil, errors.New("request body is null, not a JSON object")
	}
	maxTokens, have := int64(0), false
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		v, ok := req[k]
		if !ok || v == nil {
			continue
		}
		n, ok := wholeNumber(v, 0, maxCost)
		if !ok {
			return 0, nil, fmt.Errorf("%s is %s; want a whole number from 0 to %d (the most the budget admits at once)", k, jsonText(v), maxCost)
		}
		maxTokens, have = max(maxTokens, n), true
	}
	if !have {
		return 0, nil, errors.New("max_tokens (or max_completion_tokens) is required: the gateway reserves it before the request goes upstream")
	}
	choices := int64(1)
	if v, ok := req["n"]; ok && v != nil {
		n, ok := wholeNumber(v, 1, maxN)
		if !ok {
			return 0, nil, fmt.Errorf("n is %s; want a whole number from 1 to %d", jsonText(v), maxN)
		}
		choices = n
	}
	if completions := maxTokens * choices; completions > maxCost {
		return 0, nil, fmt.Errorf("max_tokens %d times n %d is %d tokens, more than the budget admits at once (%d)", maxTokens, choices, completions, maxCost)
	}
	if stream, _ := req["stream"].(bool); stream {
		opts, _ := req["stream_options"].(map[string]any)
		if opts == nil {
			opts = map[string]any{}
		}
		opts["include_usage"] = true
		req["stream_options"] = opts
		b, err := json.Marshal(req)
		if err != nil {
			return 0, nil, fmt.Errorf("request body: %v", err)
		}
		body = b
	}
	return int64(len(body)) + maxTokens*choices, body, nil
}

// wholeNumber returns v as an integer if it is a JSON number that is a
// whole number from lo to hi.
func wholeNumber(v any, lo, hi int64) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, false
	}
	return int64(f), true
}

// jsonText quotes a JSON value for an error message, at most 32 bytes of it.
func jsonText(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 32 {
		return string(b[:32]) + "…"
	}
	return string(b)
}

// detach serves next with a context that a client's hang-up does not
// cancel, so that the upstream's answer can still be read for its usage;
// it is cancelled drain after the hang-up, or when next returns.
func detach(next http.Handler, drain time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		defer cancel()
		stop := context.AfterFunc(r.Context(), func() {
			t := time.NewTimer(drain)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		})
		defer stop()
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, detachedKey{}, &detached{cancel: cancel, drain: drain})))
	})
}

// detachedKey carries a *detached in detach's context.
type detachedKey struct{}

// detached is how a meter bounds its reading of an answer whose client
// went away: it cancels the upstream request drain after it starts.
type detached struct {
	cancel context.CancelFunc
	drain  time.Duration
}

// meterUsage wraps a successful chat response's body so that its usage is
// read as it passes, from a JSON body or from a stream's events, and
// charged when it ends.
func meterUsage(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	r := resp.Request
	est, ok := r.Context().Value(estimateKey{}).(int64)
	if !ok {
		return nil // not a metered request
	}
	d, _ := r.Context().Value(detachedKey{}).(*detached)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	resp.Body = &meter{rc: resp.Body, r: r, estimate: est, detached: d, sse: sse}
	return nil
}

// meter reads a response body as it passes and charges its usage: the last
// top-level "usage" object of a JSON body, or of a stream's data events.
// It keeps only that object (at most maxUsage bytes) and a few bytes of
// line state, however large the body. A body that ends, or is cut, without
// a usage is charged the request's whole estimate.
type meter struct {
	rc       io.ReadCloser
	r        *http.Request
	estimate int64
	detached *detached // nil: no reading on after the client went away
	sse      bool
	done     bool // charged
	scan     usageScanner

	// Server-sent events: the state of the current line.
	field  []byte // its first bytes, up to "data:"
	inData bool   // in the value of a data line
}

// Read implements io.Reader.
func (m *meter) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if m.sse {
		m.feedSSE(p[:n])
	} else {
		m.scan.write(p[:n])
	}
	if err == io.EOF {
		m.finish()
	}
	return n, err
}

// Close reads what the client left unread, for at most the drain bound,
// then charges: the usage if one was read, else the whole estimate.
func (m *meter) Close() error {
	if !m.done {
		if m.detached != nil {
			t := time.AfterFunc(m.detached.drain, m.detached.cancel)
			_, _ = io.Copy(io.Discard, m)
			t.Stop()
		}
		m.finish()
	}
	return m.rc.Close()
}

// finish charges the usage read, or the estimate when there was none.
func (m *meter) finish() {
	if m.done {
		return
	}
	m.done = true
	if m.sse {
		m.endEvent()
	}
	if m.scan.found {
		httplimit.Charge(m.r, m.scan.total)
		return
	}
	httplimit.Charge(m.r, m.estimate)
}

// feedSSE passes the values of a stream's data lines to the scanner, one
// event at a time.
func (m *meter) feedSSE(p []byte) {
	for len(p) > 0 {
		if m.inData {
			i := bytes.IndexAny(p, "\r\n")
			if i < 0 {
				m.scan.write(p)
				return
			}
			m.scan.write(p[:i])
			m.inData = false
			p = p[i:]
			continue
		}
		c := p[0]
		p = p[1:]
		switch {
		case c == '\n' || c == '\r':
			if c == '\n' {
				if len(m.field) == 0 {
					m.endEvent() // a blank line ends the event
				}
				m.field = m.field[:0]
			}
		case len(m.field) < len("data:"):
			m.field = append(m.field, c)
			if string(m.field) == "data:" {
				m.inData = true
				m.scan.write(newline) // data lines of one event join with a newline
			}
		}
	}
}

// newline separates the data lines of one event.
var newline = []byte{'\n'}

// endEvent ends a stream event: its data is one JSON text.
func (m *meter) endEvent() { m.scan.reset() }

// usageScanner finds the value of each top-level "usage" key in a sequence
// of JSON texts fed to it in pieces, holding only that value (at most
// maxUsage bytes), and parses it when it ends.
type usageScanner struct {
	depth    int    // nesting of objects and arrays
	inString bool   // in a string
	escaped  bool   // after a backslash in a string
	wantKey  bool   // in the top-level object, where the next string is a key
	inKey    bool   // in a top-level key
	key      []byte // the top-level key, up to one byte more than "usage"
	inUsage  bool   // in the value of a top-level "usage"
	value    []byte // that value so far
	tooLong  bool   // the value was over maxUsage bytes

	found bool  // a usage with a token count was read
	total int64 // its total_tokens
}

// write scans p.
func (s *usageScanner) write(p []byte) {
	for _, c := range p {
		s.step(c)
	}
}

func (s *usageScanner) step(c byte) {
	if s.inUsage && (s.inString || s.depth > 1 || (c != ',' && c != '}')) {
		if len(s.value) < maxUsage {
			s.value = append(s.value, c)
		} else {
			s.tooLong = true
		}
	}
	if s.inString {
		switch {
		case s.escaped:
			s.escaped = false
		case c == '\\':
			s.escaped = true
		case c == '"':
			s.inString, s.inKey = false, false
			return
		}
		if s.inKey && len(s.key) <= len("usage") {
			s.key = append(s.key, c)
		}
		return
	}
	switch c {
	case '"':
		s.inString = true
		if s.depth == 1 && s.wantKey {
			s.inKey, s.wantKey, s.key = true, false, s.key[:0]
		}
	case '{', '[':
		s.depth++
		if s.depth == 1 {
			s.wantKey = c == '{'
		}
	case '}', ']':
		if s.depth == 1 {
			s.endValue()
		}
		if s.depth > 0 {
			s.depth--
		}
	case ',':
		if s.depth == 1 {
			s.endValue()
			s.wantKey = true
		}
	case ':':
		if s.depth == 1 && string(s.key) == "usage" {
			s.inUsage, s.value, s.tooLong = true, s.value[:0], false
		}
		s.key = s.key[:0]
	}
}

// endValue ends a top-level value: a usage is parsed.
func (s *usageScanner) endValue() {
	if !s.inUsage {
		return
	}
	s.inUsage = false
	if s.tooLong {
		return
	}
	var u *struct {
		TotalTokens      *int64 `json:"total_tokens"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
	}
	if json.Unmarshal(s.value, &u) != nil || u == nil {
		return // null, as in a stream's chunks before the last
	}
	total := u.PromptTokens + u.CompletionTokens
	if u.TotalTokens != nil {
		total = *u.TotalTokens
	}
	if total >= 0 {
		s.found, s.total = true, total
	}
}

// reset forgets a JSON text that ended, or was cut, keeping what was found.
func (s *usageScanner) reset() {
	s.depth, s.inString, s.escaped, s.wantKey, s.inKey, s.inUsage = 0, false, false, false, false, false
	s.key, s.value = s.key[:0], s.value[:0]
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	upstream, err := url.Parse(envOr("UPSTREAM", "https://api.openai.com"))
	if err != nil {
		log.Error("bad UPSTREAM", "err", err)
		os.Exit(1)
	}
	p, err := newPolicy(nil)
	if err != nil {
		log.Error("rules", "err", err)
		os.Exit(1)
	}
	h, err := newGateway(p, upstream, drainTimeout)
	if err != nil {
		log.Error("rules", "err", err)
		os.Exit(1)
	}
	addr := envOr("ADDR", "127.0.0.1:8090")
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Info("llm-gateway listening", "addr", addr, "upstream", upstream.String())
	if err := srv.ListenAndServe(); err != nil {
		log.Error("serve", "err", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

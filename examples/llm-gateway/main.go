// Command llm-gateway is a reverse proxy in front of OpenAI's chat
// completions and Anthropic's messages APIs that holds each API key, and
// the user, team and organisation it belongs to, to spend budgets in
// money.
//
//	OPENAI_UPSTREAM=https://api.openai.com ANTHROPIC_UPSTREAM=https://api.anthropic.com \
//	TENANTS=tenants.json go run ./examples/llm-gateway
//	curl localhost:8090/v1/chat/completions -H 'Authorization: Bearer sk-…' \
//	  -d '{"model":"gpt-4o-mini","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}'
//	curl localhost:8090/v1/messages -H 'x-api-key: sk-ant-…' -H 'anthropic-version: 2023-06-01' \
//	  -d '{"model":"claude-haiku-4-5","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}'
//
// It listens on $ADDR (default 127.0.0.1:8090; $UPSTREAM still names the
// OpenAI upstream when $OPENAI_UPSTREAM is not set). The rules (the embedded
// weir.yaml) price each model per million tokens and give a budget to
// each level: 5 USD a day per key, 20 per user, 200 per team, 2000 per 30
// days per organisation.
//
//   - The API key is the credential of "Authorization: Bearer KEY" (the
//     scheme in any case, any spaces around it) or of "x-api-key: KEY"
//     (Anthropic's header), byte for byte; both at once is a 401. The
//     gateway counts by a SHA-256 of the key (X-Weir-Key), never logs it,
//     and answers 401 to a key header it cannot read, or to a metered
//     request without one.
//   - A key's user, team and organisation come from the tenants file
//     ($TENANTS, JSON; see loadTenants): a list of {"sha256": hex of the
//     key's SHA-256, "user", "team", "org"}, at most 100,000 keys, names
//     of 1 to 128 printable ASCII bytes without spaces. A level a key
//     lacks is skipped: only the levels it has are charged. A key not
//     listed is charged at the key level only, or, with
//     UNLISTED_KEYS=refuse, refused with 403 before anything is counted
//     (a file that lists every key then holds every key to its
//     organisation's budget). The gateway
//     sets X-Weir-User, X-Weir-Team and X-Weir-Org from it, overwriting
//     what the client sent, and never sends any X-Weir-* header upstream.
//   - Before a chat completion (POST /v1/chat/completions) or a message
//     (POST /v1/messages) goes upstream, the gateway bounds its usage: the
//     request body's size in bytes as input tokens (a token is at least
//     one byte of its text in every BPE tokenizer in use, and the JSON
//     around the text is longer than the few tokens per message a chat
//     template adds), and max_tokens (or max_completion_tokens) times n as
//     output tokens. policy prices that estimate pessimistically: all
//     input at the highest of the input, cached input and cache write
//     prices, all output
//     at the higher of the output and reasoning prices, in micro-units,
//     and takes it from every level in one atomic step, all or nothing. A
//     request without a model or max_tokens, or with a max_tokens or n
//     that is not a whole number in range, gets 400 naming the value; a
//     model the price table does not list gets 400 naming the model
//     (prices.unknown: refuse), or is priced at prices.unknown; an
//     estimate over a level's whole budget gets 400.
//   - The usage the upstream reports settles the request at every level:
//     a refund of what the estimate did not use, or a debit of the excess.
//     OpenAI's usage is read from a JSON body or from the stream's last
//     chunk (the gateway asks for it with stream_options.include_usage):
//     prompt_tokens, of which prompt_tokens_details.cached_tokens are
//     priced as cached input, and completion_tokens, of which
//     completion_tokens_details.reasoning_tokens are priced as reasoning.
//     Anthropic's is read from a JSON body or from the stream's
//     message_start (input_tokens, priced as input,
//     cache_creation_input_tokens, priced at the model's cache_write price,
//     and cache_read_input_tokens, priced as cached input) and
//     message_delta (the final output_tokens) events; a stream that ends
//     before message_delta has no usage. Usage is read as it passes, from
//     a body of any size, keeping at most 64 KiB of it.
//   - A 200 response whose usage cannot be read keeps the whole estimate
//     charged, as does a 5xx or no answer at all from the upstream; a 4xx
//     without a usage (the provider refused the request, and bills
//     nothing) is refunded.
//   - Only those two calls are metered, so only they, and GET and HEAD
//     requests (GET /v1/models), go upstream: any other method or path
//     (embeddings, batches, a trailing slash) gets 404. The body the
//     upstream gets is the JSON object the gateway priced, written anew: a
//     key given twice ("model", "max_tokens") goes up once, with the value
//     priced.
//   - A client that hangs up does not stop the metering: the gateway reads
//     the rest of the upstream's answer, for at most two minutes, for its
//     usage.
//   - A level whose budget cannot take the estimate refuses the request
//     with 429, Retry-After and the RateLimit headers; nothing is taken
//     from the other levels.
//
// The bound: with text prompts and an upstream that honours max_tokens,
// the usage never exceeds the estimate, so no level's spend passes its
// budget. When a reported usage does exceed its estimate (images, audio
// and files cost tokens their bytes do not bound), a level passes its
// budget by at most the sum of (actual − estimate) of the requests in
// flight together at that level: each was admitted while every estimate
// fit. Every micro-unit settled is one of the reported usage priced by
// the table: the sum of a level's charges is the sum of its requests'
// usage × prices, each rounded up to the micro-unit.
//
// Counting is by the upstream's own usage report: the gateway never
// tokenizes. Anthropic's cache writes are priced at each model's
// cache_write price (the input price when the table gives none;
// Anthropic bills a five-minute write at 1.25 × input and an hour-long
// one at 2 × input: weir.yaml gives the five-minute price, so give the
// hour's when the gateway's clients write hour-long caches).
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
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
)

//go:embed weir.yaml
var rulesYAML []byte

const (
	// chatPath is OpenAI's chat completions.
	chatPath = "/v1/chat/completions"
	// messagesPath is Anthropic's messages.
	messagesPath = "/v1/messages"
	// keyHeader is the header the key level counts by: a hash of the API key.
	keyHeader = "X-Weir-Key"
	// userHeader, teamHeader and orgHeader name a key's parents.
	userHeader = "X-Weir-User"
	teamHeader = "X-Weir-Team"
	orgHeader  = "X-Weir-Org"
	// maxBody bounds the request body the gateway reads.
	maxBody = 1 << 20
	// maxN bounds a request's n, the number of completions it asks for.
	maxN = 128
	// maxOutput bounds a request's max_tokens.
	maxOutput = 1 << 30
	// maxModel bounds a model name's bytes.
	maxModel = 256
	// maxUsage bounds the bytes of a usage object the gateway keeps.
	maxUsage = 64 << 10
	// drainTimeout bounds how long the gateway reads an upstream answer
	// whose client went away, for its usage.
	drainTimeout = 2 * time.Minute
)

// levelHeaders are the headers the rules count by; the gateway sets them,
// a client cannot, and the upstream never sees them.
var levelHeaders = [...]string{keyHeader, userHeader, teamHeader, orgHeader}

// newPolicy compiles rules (nil: the embedded weir.yaml) over store (nil:
// in memory).
func newPolicy(rules []byte, store weir.Store) (*policy.Policy, error) {
	if rules == nil {
		rules = rulesYAML
	}
	cfg, err := policy.Parse(rules, "weir.yaml")
	if err != nil {
		return nil, err
	}
	return policy.New(cfg, store)
}

// api is the format a metered request speaks.
type api int

const (
	openAI api = iota
	anthropic
)

// gateway is the front of the proxy: it reads the caller's API key, its
// parents and the request's usage bound, and decides the budgets.
type gateway struct {
	p       *policy.Policy
	tenants tenants
	listed  atomic.Bool // refuse keys the tenants file does not list
	proxy   http.Handler
	resp    *httplimit.Responder
	log     *slog.Logger
}

// newGateway returns the proxy to the two upstreams under p's rules, with
// the keys' parents from ts; drain bounds how long it reads an answer
// whose client went away, for its usage.
func newGateway(p *policy.Policy, ts tenants, openaiURL, anthropicURL *url.URL, drain time.Duration, log *slog.Logger) *gateway {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			if pr.In.URL.Path == messagesPath {
				pr.SetURL(anthropicURL)
			} else {
				pr.SetURL(openaiURL)
			}
			for _, h := range levelHeaders {
				pr.Out.Header.Del(h)
			}
			// The transport then asks for gzip itself and decompresses, so
			// the meter reads the usage in plain JSON.
			pr.Out.Header.Del("Accept-Encoding")
		},
		ModifyResponse: meterUsage,
		FlushInterval:  -1, // pass stream events on as they come
	}
	return &gateway{p: p, tenants: ts, proxy: detach(proxy, drain), resp: httplimit.NewResponder(), log: log}
}

// ServeHTTP sets the level headers from the API key and, on a metered
// request, decides the budgets on its estimate, proxies it, and settles
// its usage.
func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, h := range levelHeaders {
		r.Header.Del(h)
	}
	key, err := apiKey(r.Header)
	if err != nil {
		unauthorized(w, err.Error())
		return
	}
	var format api
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		g.proxy.ServeHTTP(w, r) // reads (GET /v1/models) cost nothing
		return
	case r.Method == http.MethodPost && r.URL.Path == chatPath:
		format = openAI
	case r.Method == http.MethodPost && r.URL.Path == messagesPath:
		format = anthropic
	default:
		// Any other call may cost money the gateway cannot meter.
		fail(w, http.StatusNotFound, fmt.Sprintf("the gateway serves POST %s and POST %s, and GET and HEAD requests; not %s %s", chatPath, messagesPath, r.Method, trim(r.URL.Path)))
		return
	}
	if key == "" {
		unauthorized(w, "no API key: send Authorization: Bearer KEY or x-api-key: KEY")
		return
	}
	id := keyID(key)
	r.Header.Set(keyHeader, id)
	t, ok := g.tenants[id]
	if !ok && g.listed.Load() {
		fail(w, http.StatusForbidden, "the API key is not in the gateway's tenants file")
		return
	}
	if ok {
		for _, l := range [...]struct{ h, v string }{{userHeader, t.User}, {teamHeader, t.Team}, {orgHeader, t.Org}} {
			if l.v != "" {
				r.Header.Set(l.h, l.v)
			}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes, or unreadable", maxBody))
		return
	}
	est, out, err := prepare(format, body)
	if err != nil {
		fail(w, http.StatusBadRequest, err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(out))
	r.ContentLength = int64(len(out))
	ctx := policy.WithUsage(r.Context(), est)
	v := g.p.Check(ctx, r)
	if v.BadCost != nil {
		fail(w, http.StatusBadRequest, v.BadCost.Error())
		return
	}
	defer v.Release(context.WithoutCancel(ctx))
	if v.Denied {
		g.resp.Reject(w, r, httplimit.Rejection{Status: http.StatusForbidden})
		return
	}
	statuses, limiting := policy.StatusesOf(&v)
	g.resp.WriteHeaders(w.Header(), statuses, limiting, false)
	if !v.Allowed {
		rej := httplimit.Rejection{Status: http.StatusTooManyRequests, Statuses: statuses}
		rej.RetryAfter, _ = httplimit.RetryAfter(statuses)
		if rr, ok := v.Limited(); ok {
			rej.Rule, rej.Result = rr.Rule, rr.Result
			if rr.Err != nil {
				rej.Status, rej.Err = http.StatusServiceUnavailable, rr.Err
			}
		}
		g.resp.Reject(w, r, rej)
		return
	}
	b := &bill{api: format}
	// Settled in a defer: when writing to a client that went away fails,
	// the reverse proxy aborts the handler by panicking with
	// http.ErrAbortHandler, after the meter has read the rest of the
	// answer; the settlement must still run.
	defer g.settle(ctx, &v, est.Model, b)
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, billKey{}, b)))
}

// settle charges a metered request's levels by what the meter read of
// its answer: the usage, nothing for a 4xx without one, else the whole
// estimate stays charged.
func (g *gateway) settle(ctx context.Context, v *policy.Verdict, model string, b *bill) {
	ch := policy.Charges{Status: b.status}
	switch {
	case b.found:
		u := b.usage
		u.Model = model
		ch.Usage = &u
	case b.status >= 400 && b.status < 500:
		ch.Usage = &policy.Usage{Model: model} // refused upstream: nothing billed
	}
	if err := g.p.Finish(context.WithoutCancel(ctx), v, ch); err != nil {
		// The store failed, or the usage could not be priced: the estimate
		// stays charged. The error names rules and hashed keys only.
		g.log.Warn("llm-gateway: settling a request failed", "err", err)
	}
}

// fail answers an OpenAI-style error.
func fail(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}})
	w.Write(append(b, '\n'))
}

// unauthorized answers 401 with msg.
func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", "Bearer")
	fail(w, http.StatusUnauthorized, msg)
}

// apiKey returns the request's API key: the credential of a "Bearer KEY"
// Authorization header, or an x-api-key header; "" when there is neither.
// Errors never quote the key.
func apiKey(h http.Header) (string, error) {
	auth, xkey := h.Values("Authorization"), h.Values("X-Api-Key")
	switch {
	case len(auth) > 0 && len(xkey) > 0:
		return "", errors.New("both Authorization and x-api-key are set; send one")
	case len(xkey) > 1:
		return "", fmt.Errorf("%d x-api-key headers; send one", len(xkey))
	case len(xkey) == 1:
		return checkKey("x-api-key", strings.Trim(xkey[0], " \t"))
	case len(auth) == 0:
		return "", nil
	}
	return bearer(auth)
}

// bearer returns the credential of a "Bearer KEY" Authorization header: the
// scheme in any case, spaces and tabs around and after it ignored, the key
// exact (RFC 6750's token68).
func bearer(values []string) (string, error) {
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
	return checkKey("the API key after Bearer", key)
}

// checkKey returns key if it is a token68, else an error naming where.
func checkKey(where, key string) (string, error) {
	end := len(key)
	for end > 0 && key[end-1] == '=' {
		end--
	}
	if end == 0 {
		return "", fmt.Errorf("%s is empty", where)
	}
	for j := 0; j < end; j++ {
		if c := key[j]; !token68(c) {
			return "", fmt.Errorf("%s has %q at byte %d, which a key cannot hold (want letters, digits and -._~+/, then any =)", where, c, j)
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

// keyID is what the key level counts an API key by: its SHA-256, in hex.
func keyID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// prepare returns the usage bound of a request in format f and the body
// to send upstream: the object read, written anew (a streamed OpenAI
// request gets stream_options.include_usage). The bound is the body's size in bytes as
// input tokens (the prompt's tokens cannot exceed it) and max_tokens (or
// max_completion_tokens, whichever is larger) times n as output tokens.
// A body that is not a JSON object, a missing model, or a missing or
// invalid max_tokens or n is an error that names the value.
func prepare(f api, body []byte) (policy.Usage, []byte, error) {
	var req map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // numbers go upstream as they came
	err := dec.Decode(&req)
	if err == nil && dec.Decode(new(any)) != io.EOF {
		err = errors.New("more than one JSON value")
	}
	if err != nil {
		return policy.Usage{}, nil, fmt.Errorf("request body is not a JSON object: %v", err)
	}
	if req == nil {
		return policy.Usage{}, nil, errors.New("request body is null, not a JSON object")
	}
	model, ok := req["model"].(string)
	if !ok || model == "" || len(model) > maxModel {
		return policy.Usage{}, nil, fmt.Errorf("model is %s; want the model's name, 1 to %d bytes", jsonText(req["model"]), maxModel)
	}
	names := []string{"max_completion_tokens", "max_tokens"}
	if f == anthropic {
		names = names[1:]
	}
	maxTokens, have := int64(0), false
	for _, k := range names {
		v, ok := req[k]
		if !ok || v == nil {
			continue
		}
		n, ok := wholeNumber(v, 0, maxOutput)
		if !ok {
			return policy.Usage{}, nil, fmt.Errorf("%s is %s; want a whole number from 0 to %d", k, jsonText(v), maxOutput)
		}
		maxTokens, have = max(maxTokens, n), true
	}
	if !have {
		what := "max_tokens (or max_completion_tokens)"
		if f == anthropic {
			what = "max_tokens"
		}
		return policy.Usage{}, nil, fmt.Errorf("%s is required: the gateway reserves it before the request goes upstream", what)
	}
	choices := int64(1)
	if v, ok := req["n"]; ok && v != nil && f == openAI {
		n, ok := wholeNumber(v, 1, maxN)
		if !ok {
			return policy.Usage{}, nil, fmt.Errorf("n is %s; want a whole number from 1 to %d", jsonText(v), maxN)
		}
		choices = n
	}
	if stream, _ := req["stream"].(bool); stream && f == openAI {
		opts, _ := req["stream_options"].(map[string]any)
		if opts == nil {
			opts = map[string]any{}
		}
		opts["include_usage"] = true
		req["stream_options"] = opts
	}
	// The upstream gets the object the gateway priced: a key given twice
	// ("model", "max_tokens") goes up once, with the value read here.
	out, err := json.Marshal(req)
	if err != nil {
		return policy.Usage{}, nil, fmt.Errorf("request body: %v", err)
	}
	return policy.Usage{Model: model, InputTokens: int64(len(out)), OutputTokens: maxTokens * choices}, out, nil
}

// wholeNumber returns v as an integer if it is a JSON number that is a
// whole number from lo to hi.
func wholeNumber(v any, lo, hi int64) (int64, bool) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := num.Float64()
	if err != nil || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
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

// billKey carries a metered request's *bill in its context.
type billKey struct{}

// bill is what the meter read of a metered request's answer: its status
// (0: no answer), and its usage if found. The gateway reads it once the
// proxy has returned, when the meter is done.
type bill struct {
	api    api
	status int
	found  bool
	usage  policy.Usage
}

// meterUsage wraps a metered response's body so that its usage is read as
// it passes, from a JSON body or from a stream's events.
func meterUsage(resp *http.Response) error {
	r := resp.Request
	b, ok := r.Context().Value(billKey{}).(*bill)
	if !ok {
		return nil // not a metered request
	}
	b.status = resp.StatusCode
	d, _ := r.Context().Value(detachedKey{}).(*detached)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	resp.Body = &meter{rc: resp.Body, bill: b, detached: d, sse: sse, scan: usageScanner{api: b.api}}
	return nil
}

// meter reads a response body as it passes and records its usage in its
// bill: the top-level "usage" objects of a JSON body or of a stream's data
// events (and, for Anthropic, the usage in a top-level "message"). It
// keeps only such an object (at most maxUsage bytes) and a few bytes of
// line state, however large the body.
type meter struct {
	rc       io.ReadCloser
	bill     *bill
	detached *detached // nil: no reading on after the client went away
	sse      bool
	done     bool // recorded
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
// then records the usage read.
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

// finish records the usage read, if any.
func (m *meter) finish() {
	if m.done {
		return
	}
	m.done = true
	if m.sse {
		m.endEvent()
	}
	m.bill.found, m.bill.usage = m.scan.found, m.scan.usage()
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

// usageScanner finds the value of each top-level "usage" key, and of each
// "usage" key in a top-level "message" object (Anthropic's message_start),
// in a sequence of JSON texts fed to it in pieces, holding only that value
// (at most maxUsage bytes), and adds it to the usage read when it ends.
type usageScanner struct {
	api api

	depth     int    // nesting of objects and arrays
	inString  bool   // in a string
	escaped   bool   // after a backslash in a string
	wantKey   bool   // in an object whose keys count, where the next string is a key
	inKey     bool   // in such a key
	key       []byte // the key, up to one byte more than "message"
	inMessage bool   // in the value of a top-level "message"
	msgObject bool   // that value is an object
	at        int    // the depth of the object holding the usage being read; 0: none
	value     []byte // that usage so far
	tooLong   bool   // the value was over maxUsage bytes

	found bool // a complete usage was read
	// The counts read so far.
	openai                                     [4]int64 // input, cached input, output, reasoning
	input, cacheWrite, cacheRead, outputTokens int64    // Anthropic's
}

// write scans p.
func (s *usageScanner) write(p []byte) {
	for _, c := range p {
		s.step(c)
	}
}

// keyed reports whether the keys of the object at the current depth count.
func (s *usageScanner) keyed() bool {
	return s.depth == 1 || s.depth == 2 && s.inMessage && s.msgObject
}

func (s *usageScanner) step(c byte) {
	if s.at > 0 && (s.inString || s.depth > s.at || (c != ',' && c != '}')) {
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
		if s.inKey && len(s.key) <= len("message") {
			s.key = append(s.key, c)
		}
		return
	}
	switch c {
	case '"':
		s.inString = true
		if s.wantKey && s.keyed() {
			s.inKey, s.wantKey, s.key = true, false, s.key[:0]
		}
	case '{', '[':
		s.depth++
		switch {
		case s.depth == 1:
			s.wantKey = c == '{'
		case s.depth == 2 && s.inMessage:
			s.msgObject = c == '{'
			s.wantKey = s.msgObject
		}
	case '}', ']':
		if s.keyed() {
			s.endValue()
		}
		if s.depth == 1 {
			s.inMessage = false
		}
		if s.depth > 0 {
			s.depth--
		}
	case ',':
		if s.keyed() {
			s.endValue()
			s.wantKey = true
			if s.depth == 1 {
				s.inMessage = false
			}
		}
	case ':':
		if s.keyed() {
			switch string(s.key) {
			case "usage":
				s.at, s.value, s.tooLong = s.depth, s.value[:0], false
			case "message":
				if s.depth == 1 {
					s.inMessage, s.msgObject = true, false
				}
			}
		}
		s.key = s.key[:0]
	}
}

// rawUsage is a usage object of either API.
type rawUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`

	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
}

// endValue ends the value at the current depth: a usage is read.
func (s *usageScanner) endValue() {
	if s.at == 0 || s.at != s.depth {
		return
	}
	nested := s.at > 1
	s.at = 0
	if s.tooLong {
		return
	}
	var u *rawUsage
	if json.Unmarshal(s.value, &u) != nil || u == nil {
		return // null, as in an OpenAI stream's chunks before the last
	}
	if s.api == openAI {
		if nested || u.PromptTokens == nil || u.CompletionTokens == nil {
			return
		}
		var cached, reasoning int64
		if u.PromptTokensDetails != nil {
			cached = u.PromptTokensDetails.CachedTokens
		}
		if u.CompletionTokensDetails != nil {
			reasoning = u.CompletionTokensDetails.ReasoningTokens
		}
		p, c := *u.PromptTokens, *u.CompletionTokens
		if cached < 0 || reasoning < 0 || cached > p || reasoning > c {
			return // not a usage: the estimate stays
		}
		s.found, s.openai = true, [4]int64{p - cached, cached, c - reasoning, reasoning}
		return
	}
	// Anthropic: message_start's usage has the input counts, message_delta's
	// the final output count (and, lately, the input counts again). A
	// count read later replaces the earlier one.
	fields := [4]*int64{u.InputTokens, u.CacheCreationInputTokens, u.CacheReadInputTokens, u.OutputTokens}
	dst := [4]*int64{&s.input, &s.cacheWrite, &s.cacheRead, &s.outputTokens}
	if slices.ContainsFunc(fields[:], func(p *int64) bool { return p != nil && *p < 0 }) {
		return
	}
	for i, f := range fields {
		if f != nil {
			*dst[i] = *f
		}
	}
	if !nested && u.OutputTokens != nil {
		s.found = true // the final output count: the usage is complete
	}
}

// usage returns the usage read, in policy's disjoint counts.
func (s *usageScanner) usage() policy.Usage {
	if s.api == openAI {
		return policy.Usage{InputTokens: s.openai[0], CachedInputTokens: s.openai[1], OutputTokens: s.openai[2], ReasoningTokens: s.openai[3]}
	}
	return policy.Usage{InputTokens: s.input, CacheWriteTokens: s.cacheWrite, CachedInputTokens: s.cacheRead, OutputTokens: s.outputTokens}
}

// reset forgets a JSON text that ended, or was cut, keeping what was found.
func (s *usageScanner) reset() {
	s.depth, s.inString, s.escaped, s.wantKey, s.inKey, s.inMessage, s.msgObject, s.at = 0, false, false, false, false, false, false, 0
	s.key, s.value = s.key[:0], s.value[:0]
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	oai, err := url.Parse(envOr("OPENAI_UPSTREAM", envOr("UPSTREAM", "https://api.openai.com")))
	if err != nil {
		log.Error("bad OPENAI_UPSTREAM", "err", err)
		os.Exit(1)
	}
	ant, err := url.Parse(envOr("ANTHROPIC_UPSTREAM", "https://api.anthropic.com"))
	if err != nil {
		log.Error("bad ANTHROPIC_UPSTREAM", "err", err)
		os.Exit(1)
	}
	ts := tenants{}
	if path := os.Getenv("TENANTS"); path != "" {
		if ts, err = loadTenants(path); err != nil {
			log.Error("tenants", "err", err)
			os.Exit(1)
		}
	}
	p, err := newPolicy(nil, nil)
	if err != nil {
		log.Error("rules", "err", err)
		os.Exit(1)
	}
	g := newGateway(p, ts, oai, ant, drainTimeout, log)
	switch v := os.Getenv("UNLISTED_KEYS"); v {
	case "refuse":
		g.listed.Store(true)
	case "", "key":
	default:
		log.Error("UNLISTED_KEYS must be refuse or key (charged at the key level only)", "value", v)
		os.Exit(1)
	}
	addr := envOr("ADDR", "127.0.0.1:8090")
	srv := &http.Server{Addr: addr, Handler: g, ReadHeaderTimeout: 10 * time.Second}
	log.Info("llm-gateway listening", "addr", addr, "openai", oai.String(), "anthropic", ant.String(), "keys", len(ts))
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

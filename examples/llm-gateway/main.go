// Command llm-gateway is a reverse proxy in front of an OpenAI-style chat
// API that limits LLM tokens per minute per API key.
//
//	UPSTREAM=https://api.openai.com go run ./examples/llm-gateway
//	curl localhost:8095/v1/chat/completions -H 'Authorization: Bearer sk-…' \
//	  -d '{"model":"gpt-4o-mini","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}'
//
// It listens on $ADDR (default 127.0.0.1:8095). The rule (the embedded
// weir.yaml) is a token bucket of 10,000 tokens a minute per Authorization
// header, with cost: header:X-Weir-Max-Tokens:
//
//   - before the request goes upstream, the gateway reads max_tokens (or
//     max_completion_tokens; 1024 when absent) from the JSON body into
//     X-Weir-Max-Tokens, and the rule reserves that many tokens;
//   - the response's usage.total_tokens is charged with httplimit.Charge,
//     from a plain JSON body or from the last event of a server-sent-event
//     stream (the gateway asks for it with stream_options.include_usage);
//     the middleware then refunds what the reservation did not use, or
//     debits the excess, into debt if need be;
//   - a key in debt, or out of tokens, gets 429 with Retry-After and the
//     RateLimit headers, until the debt is paid back at the rule's rate.
//
// A stream cut before its usage event leaves the reservation charged.
// Counting is by the upstream's own usage report: the gateway never
// tokenizes.
package main

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"io"
	"log/slog"
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

// costHeader is the header the rule reads its estimate from.
const costHeader = "X-Weir-Max-Tokens"

// defaultMaxTokens is the estimate of a request that names no max_tokens.
const defaultMaxTokens = 1024

// maxBody bounds the request body the gateway reads.
const maxBody = 1 << 20

// newPolicy compiles the embedded rules over store (nil: in memory).
func newPolicy(store weir.Store) (*policy.Policy, error) {
	cfg, err := policy.Parse(rulesYAML, "weir.yaml")
	if err != nil {
		return nil, err
	}
	return policy.New(cfg, store)
}

// newGateway returns the proxy to upstream under p's rules.
func newGateway(p *policy.Policy, upstream *url.URL) http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Header.Del(costHeader)
		},
		ModifyResponse: meterUsage,
		FlushInterval:  -1, // pass stream events on as they come
	}
	return estimate(policy.Middleware(p)(proxy))
}

// estimate reads the request's max_tokens into X-Weir-Max-Tokens, always
// overwriting what the client sent, and asks a streamed completion to end
// with its usage.
func estimate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(costHeader)
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				http.Error(w, "request body too large or unreadable", http.StatusRequestEntityTooLarge)
				return
			}
			n, out := prepare(body)
			r.Header.Set(costHeader, strconv.FormatInt(n, 10))
			r.Body = io.NopCloser(bytes.NewReader(out))
			r.ContentLength = int64(len(out))
		}
		next.ServeHTTP(w, r)
	})
}

// prepare returns the estimate of a chat request body and the body to
// send upstream: a streamed request gets stream_options.include_usage.
func prepare(body []byte) (int64, []byte) {
	var req map[string]any
	if json.Unmarshal(body, &req) != nil {
		return defaultMaxTokens, body // the upstream will refuse it
	}
	n := int64(defaultMaxTokens)
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		if v, ok := req[k].(float64); ok && v >= 0 && v == float64(int64(v)) {
			n = int64(v)
		}
	}
	if stream, _ := req["stream"].(bool); stream {
		opts, _ := req["stream_options"].(map[string]any)
		if opts == nil {
			opts = map[string]any{}
		}
		opts["include_usage"] = true
		req["stream_options"] = opts
		if b, err := json.Marshal(req); err == nil {
			body = b
		}
	}
	return n, body
}

// usage is the part of a completion (or of a stream's last event) that
// counts.
type usage struct {
	Usage *struct {
		TotalTokens int64 `json:"total_tokens"`
	} `json:"usage"`
}

// meterUsage wraps a successful response's body so that its usage is
// charged as it passes: at the end of a JSON body, or at the event of a
// stream that carries it.
func meterUsage(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	r := resp.Request
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body = &sseMeter{rc: resp.Body, r: r}
		return nil
	}
	resp.Body = &jsonMeter{rc: resp.Body, r: r}
	return nil
}

// jsonMeter keeps a JSON body (at most maxBody) and charges its usage at
// the end.
type jsonMeter struct {
	rc  io.ReadCloser
	r   *http.Request
	buf bytes.Buffer
}

func (m *jsonMeter) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if m.buf.Len()+n <= maxBody {
		m.buf.Write(p[:n])
	}
	if err == io.EOF {
		var u usage
		if json.Unmarshal(m.buf.Bytes(), &u) == nil && u.Usage != nil {
			httplimit.Charge(m.r, u.Usage.TotalTokens)
		}
	}
	return n, err
}

func (m *jsonMeter) Close() error { return m.rc.Close() }

// sseMeter reads a server-sent-event stream line by line as it passes and
// charges the usage of any data event that carries one.
type sseMeter struct {
	rc   io.ReadCloser
	r    *http.Request
	line []byte
}

func (m *sseMeter) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	for _, c := range p[:n] {
		if c != '\n' {
			if len(m.line) < maxBody {
				m.line = append(m.line, c)
			}
			continue
		}
		m.event(bytes.TrimRight(m.line, "\r"))
		m.line = m.line[:0]
	}
	return n, err
}

// event charges a "data: {...}" line's usage.
func (m *sseMeter) event(line []byte) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return
	}
	var u usage
	if json.Unmarshal(bytes.TrimSpace(data), &u) == nil && u.Usage != nil {
		httplimit.Charge(m.r, u.Usage.TotalTokens)
	}
}

func (m *sseMeter) Close() error { return m.rc.Close() }

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
	addr := envOr("ADDR", "127.0.0.1:8095")
	srv := &http.Server{Addr: addr, Handler: newGateway(p, upstream), ReadHeaderTimeout: 10 * time.Second}
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

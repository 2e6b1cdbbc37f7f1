// Package grpclimit puts weir rate limits in front of gRPC servers: unary
// and stream server interceptors that apply one weir.Limit (New) or a whole
// policy loaded from weir.yaml (NewPolicy).
//
//	lim := weir.NewLimiter(memstore.New())
//	ic := grpclimit.New(lim, weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Second})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
//
// A call is keyed by its peer's address (KeyByPeer, the default; behind
// trusted proxies, the rightmost untrusted x-forwarded-for entry), by a
// metadata value (KeyByMetadata), or by any function (WithKey).
//
// A rejected call ends with codes.ResourceExhausted and a
// google.rpc.RetryInfo detail whose retry_delay says when the same call
// would be admitted; the rate-limit headers (ratelimit, ratelimit-policy,
// retry-after, rendered as httplimit.DraftHeaders renders them) travel as
// trailing metadata. An admitted call gets ratelimit and ratelimit-policy
// as header metadata. A concurrency limit holds its lease until the unary
// handler returns or the stream ends, even if the handler panics; a shaping
// leaky bucket holds the call for Result.Delay before the handler runs.
//
// When the store fails the call passes (FailOpen, the default) or ends
// with codes.Unavailable (WithErrorPolicy(httplimit.FailClosed)); a policy
// decides per rule with on_error.
//
// A policy's count: {status: [...]} rules take their cost before the
// handler and give it back when the call ends with a code whose HTTP
// status they do not count. Codes map to statuses as Google APIs and
// grpc-gateway map them: OK 200; InvalidArgument, FailedPrecondition and
// OutOfRange 400; Unauthenticated 401; PermissionDenied 403; NotFound 404;
// AlreadyExists and Aborted 409; ResourceExhausted 429; Canceled 499;
// Unknown, Internal, DataLoss and any other code 500; Unimplemented 501;
// Unavailable 503; DeadlineExceeded 504. A handler that panics ends as
// Internal. A cost: rule takes its cost (a constant, or a metadata value
// for header:NAME) before the handler and keeps it: a gRPC handler has no
// httplimit.Charge.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/internal/waitctx"
	"github.com/weir-dev/weir/policy"
)

// DefaultName is the rule name New uses in keys and headers unless WithName
// gives another.
const DefaultName = "grpc"

// ErrNoKey is returned by a key function when the call carries no
// identity; the call is rejected with codes.InvalidArgument, unless the
// function returns httplimit.ErrNoLimit, which lets it pass unlimited.
var ErrNoKey = errors.New("grpclimit: the call carries no identity")

// maxKeyLen bounds a key taken from metadata: a client cannot make the
// store keep arbitrarily long keys.
const maxKeyLen = 256

// Option configures an Interceptor.
type Option func(*config)

type config struct {
	name        string
	key         func(ctx context.Context, fullMethod string) (string, error)
	trusted     []netip.Prefix
	ipHeader    string
	errorPolicy httplimit.ErrorPolicy
	formatter   httplimit.HeaderFormatter
	sleep       func(context.Context, time.Duration) error
	err         error
}

// WithName names the rule New applies, in store keys and headers. The
// default is DefaultName.
func WithName(rule string) Option { return func(c *config) { c.name = rule } }

// KeyByPeer keys calls by the peer's IP address (the default). When the
// peer lies inside one of trusted, a proxy you run, the client address is
// read from the call's x-forwarded-for metadata, walked from the right:
// the first entry outside trusted is the client, as Envoy and other gRPC
// proxies append it (see WithClientIPHeader for another header).
// Metadata from any other peer is ignored, and x-real-ip is not read
// unless WithClientIPHeader names it, so a client cannot choose its own
// key. IPv6 clients are grouped by their /64, as httplimit.KeyByIP does.
func KeyByPeer(trusted ...netip.Prefix) Option {
	trusted = append([]netip.Prefix(nil), trusted...)
	return func(c *config) {
		c.trusted = trusted
		c.key = nil
	}
}

// WithClientIPHeader names the metadata key that carries the client
// address when the peer is trusted (see KeyByPeer and
// clientip.From): "x-forwarded-for" (the default, also ""), "x-real-ip",
// any other key your proxy sets, or "auto". Name x-real-ip, or "auto"
// (x-real-ip first), only when your proxy overwrites x-real-ip: Envoy
// passes a client's own x-real-ip through, which would let the client
// choose its key.
func WithClientIPHeader(name string) Option {
	return func(c *config) {
		if strings.TrimSpace(name) == "" {
			c.ipHeader = clientip.ForwardedFor
			return
		}
		h, ok := clientip.CanonicalHeader(name)
		if !ok {
			c.err = fmt.Errorf("WithClientIPHeader(%q): not a metadata key", name)
			return
		}
		c.ipHeader = h
	}
}

// KeyByMetadata keys calls by the first value of the metadata key name
// (such as "x-api-key"), trimmed. A call without it, or with a value over
// 256 bytes, is rejected with codes.InvalidArgument.
func KeyByMetadata(name string) Option {
	name = strings.ToLower(name)
	return WithKey(func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		vals := md.Get(name)
		if len(vals) == 0 {
			return "", fmt.Errorf("%w: no %q metadata", ErrNoKey, name)
		}
		v := strings.TrimSpace(vals[0])
		if v == "" || len(v) > maxKeyLen {
			return "", fmt.Errorf("%w: %q metadata is empty or longer than %d bytes", ErrNoKey, name, maxKeyLen)
		}
		return v, nil
	})
}

// WithKey makes fn identify the caller of a call to fullMethod. An error
// rejects the call with codes.InvalidArgument, except httplimit.ErrNoLimit,
// which lets it pass unlimited. fn must bound what it returns: every
// distinct key is a distinct state in the store.
func WithKey(fn func(ctx context.Context, fullMethod string) (string, error)) Option {
	return func(c *config) { c.key = fn }
}

// WithErrorPolicy says what New does with a call when the store fails:
// httplimit.FailOpen (the default) lets it through, httplimit.FailClosed
// ends it with codes.Unavailable. For NewPolicy it applies only while the
// getter returns no policy; rules choose with on_error.
func WithErrorPolicy(p httplimit.ErrorPolicy) Option {
	return func(c *config) { c.errorPolicy = p }
}

// WithHeaderFormatter replaces the draft headers with f's; the header
// names f writes become metadata keys in lower case.
func WithHeaderFormatter(f httplimit.HeaderFormatter) Option {
	return func(c *config) { c.formatter = f }
}

// WithSleep replaces the timer that holds shaped calls (see
// httplimit.WithSleep).
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *config) { c.sleep = sleep }
}

// Interceptor applies a limit or a policy to gRPC calls. Its Unary and
// Stream methods return the server interceptors; both share its state.
type Interceptor struct {
	c     *config
	lim   *weir.Limiter
	limit weir.Limit
	pol   func() *policy.Policy
}

// New returns an Interceptor applying l to every call, each key (by
// default each peer address) separately. It panics if lim is nil, l is
// invalid or an option is bad: programming errors found at start-up.
func New(lim *weir.Limiter, l weir.Limit, opts ...Option) *Interceptor {
	if lim == nil {
		panic("grpclimit: New with a nil Limiter")
	}
	if err := l.Validate(); err != nil {
		panic("grpclimit: " + err.Error())
	}
	return &Interceptor{c: newConfig(opts), lim: lim, limit: l}
}

// NewPolicy returns an Interceptor applying the rules of the policy get
// returns, called once per call, so that a reloading holder
// (policy.Watch's Load) can swap rule sets. Each call is presented to the
// policy as an HTTP request: method POST, path the full method name
// ("/pkg.Service/Method"), host the :authority, headers the metadata
// (binary "-bin" keys left out), remote address the peer. So rules match by
// path, identities may be ip (trusted_proxies and client_ip_header
// honoured: behind Envoy set client_ip_header: X-Forwarded-For), header or
// route, and allow and deny lists apply; a deny-listed call ends with
// codes.PermissionDenied, and a cost: value that is no whole number the
// rule admits with codes.InvalidArgument. count: rules settle by the
// call's code, mapped to an HTTP status as the package documentation says.
// WithName, KeyByPeer, KeyByMetadata and WithKey do not apply.
func NewPolicy(get func() *policy.Policy, opts ...Option) *Interceptor {
	if get == nil {
		panic("grpclimit: NewPolicy with a nil getter")
	}
	return &Interceptor{c: newConfig(opts), pol: get}
}

func newConfig(opts []Option) *config {
	c := &config{name: DefaultName, ipHeader: clientip.ForwardedFor, sleep: waitctx.Sleep}
	for _, o := range opts {
		o(c)
	}
	if c.err != nil {
		panic("grpclimit: " + c.err.Error())
	}
	return c
}

// Unary returns the unary server interceptor.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		finish, err := ic.admit(ctx, info.FullMethod, grpcSink{ctx})
		if err != nil {
			return nil, err
		}
		code := codes.Internal // if the handler panics
		defer func() { finish(code) }()
		resp, err := handler(ctx, req)
		code = codeOf(err)
		return resp, err
	}
}

// Stream returns the stream server interceptor. A concurrency lease is
// held until the stream's handler returns, that is, until the stream ends.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		finish, err := ic.admit(ss.Context(), info.FullMethod, ss)
		if err != nil {
			return err
		}
		code := codes.Internal // if the handler panics
		defer func() { finish(code) }()
		err = handler(srv, ss)
		code = codeOf(err)
		return err
	}
}

// sink is where the rate-limit metadata goes: the unary call's context
// (grpc.SetHeader, grpc.SetTrailer) or the stream.
type sink interface {
	SetHeader(metadata.MD) error
	SetTrailer(metadata.MD)
}

type grpcSink struct{ ctx context.Context }

func (s grpcSink) SetHeader(md metadata.MD) error { return grpc.SetHeader(s.ctx, md) }
func (s grpcSink) SetTrailer(md metadata.MD)      { _ = grpc.SetTrailer(s.ctx, md) }

func noop(codes.Code) {}

// codeOf is the code a call whose handler returned err ends with, as the
// gRPC server reports it: a context error is Canceled or DeadlineExceeded,
// any other error without a status Unknown.
func codeOf(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return status.FromContextError(err).Code()
}

// httpStatus maps a gRPC code to the HTTP status count: rules name, as
// Google APIs and grpc-gateway map them.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Canceled:
		return httplimit.StatusClientClosedRequest
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss, any other
}

// admit decides the call; on admission it returns the function that
// settles and releases what the call holds, given the code the call ended
// with.
func (ic *Interceptor) admit(ctx context.Context, method string, out sink) (func(codes.Code), error) {
	if ic.pol != nil {
		return ic.admitPolicy(ctx, method, out)
	}
	c := ic.c
	var id string
	if c.key != nil {
		k, err := c.key(ctx, method)
		if err != nil {
			if errors.Is(err, httplimit.ErrNoLimit) {
				return noop, nil
			}
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		id = k
	} else {
		id = ic.peerKey(ctx)
	}
	key := weir.Key(c.name, id)
	var (
		res   weir.Result
		lease *weir.Lease
		err   error
	)
	if ic.limit.Algorithm == weir.Concurrency {
		lease, res, err = ic.lim.Acquire(ctx, key, ic.limit)
	} else {
		res, err = ic.lim.Allow(ctx, key, ic.limit)
	}
	if err != nil {
		if c.errorPolicy == httplimit.FailClosed {
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable")
		}
		return noop, nil
	}
	st := []httplimit.Status{{Rule: c.name, Limit: ic.limit, Result: res}}
	if !res.Allowed {
		return nil, ic.reject(out, st, 0, res.RetryAfter)
	}
	release := noop
	if lease != nil {
		release = func(codes.Code) { _ = lease.Release(context.WithoutCancel(ctx)) }
	}
	_ = out.SetHeader(ic.md(st, 0))
	if res.Delay > 0 {
		if err := c.sleep(ctx, res.Delay); err != nil {
			s := status.FromContextError(err)
			release(s.Code())
			return nil, s.Err()
		}
	}
	return release, nil
}

// admitPolicy is admit for NewPolicy.
func (ic *Interceptor) admitPolicy(ctx context.Context, method string, out sink) (func(codes.Code), error) {
	p := ic.pol()
	if p == nil {
		if ic.c.errorPolicy == httplimit.FailClosed {
			return nil, status.Error(codes.Unavailable, "no rate-limit policy loaded")
		}
		return noop, nil
	}
	v := p.Check(ctx, callRequest(ctx, method))
	if v.BadCost != nil {
		return nil, status.Error(codes.InvalidArgument, v.BadCost.Error())
	}
	release := func() { _ = v.Release(context.WithoutCancel(ctx)) }
	finish := func(code codes.Code) {
		defer release()
		// A count rule took 1 before the handler; a code it does not count
		// gives it back. A store failure leaves it taken; the error names
		// rules and hashed keys, never identities.
		if err := p.Finish(context.WithoutCancel(ctx), &v, policy.Charges{Status: httpStatus(code)}); err != nil {
			slog.Default().Warn("weir: settling a call's count rules failed", "err", err)
		}
	}
	switch {
	case v.AllowListed:
		return finish, nil
	case v.Denied:
		release()
		return nil, status.Error(codes.PermissionDenied, "denied by the rate-limit policy")
	}
	statuses, limiting := policy.StatusesOf(&v)
	if !v.Allowed {
		release()
		if rr, ok := v.Limited(); ok && rr.Err != nil {
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable")
		}
		retry, _ := httplimit.RetryAfter(statuses)
		return nil, ic.reject(out, statuses, limiting, retry)
	}
	if len(statuses) > 0 {
		_ = out.SetHeader(ic.md(statuses, limiting))
	}
	var delay time.Duration
	for i := range v.Results {
		if rr := &v.Results[i]; !rr.Shadow && !rr.Skipped {
			delay = max(delay, rr.Result.Delay)
		}
	}
	if delay > 0 {
		if err := ic.c.sleep(ctx, delay); err != nil {
			s := status.FromContextError(err)
			finish(s.Code())
			return nil, s.Err()
		}
	}
	return finish, nil
}

// reject builds the ResourceExhausted status with its RetryInfo and sets
// the rate-limit trailers.
func (ic *Interceptor) reject(out sink, st []httplimit.Status, limiting int, retry time.Duration) error {
	out.SetTrailer(ic.md(st, limiting))
	s := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit exceeded, retry in %v", retry))
	if d, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		s = d
	}
	return s.Err()
}

// md renders the rate-limit headers as metadata.
func (ic *Interceptor) md(st []httplimit.Status, limiting int) metadata.MD {
	h := make(http.Header, 3)
	httplimit.WriteHeaders(h, st, limiting, ic.c.formatter)
	md := make(metadata.MD, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}

// peerKey is the client-address key of the call: the peer, or the address
// a trusted proxy forwarded in the metadata, grouped as KeyByIP groups.
func (ic *Interceptor) peerKey(ctx context.Context) string {
	r := http.Request{RemoteAddr: peerAddr(ctx)}
	if len(ic.c.trusted) > 0 {
		r.Header = mdHeader(ctx)
	}
	a := clientip.From(&r, ic.c.trusted, ic.c.ipHeader)
	if !a.IsValid() {
		return r.RemoteAddr
	}
	return string(clientip.AppendGroup(nil, a, 32, clientip.DefaultIPv6Bits))
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if p.Addr.Network() == "unix" {
			return "unix"
		}
		return p.Addr.String()
	}
	return ""
}

// mdHeader converts the incoming metadata into an http.Header, binary
// values left out.
func mdHeader(ctx context.Context) http.Header {
	md, _ := metadata.FromIncomingContext(ctx)
	h := make(http.Header, len(md))
	for k, v := range md {
		if strings.HasSuffix(k, "-bin") || strings.HasPrefix(k, ":") {
			continue
		}
		h[http.CanonicalHeaderKey(k)] = v
	}
	return h
}

// callRequest presents a call to a policy as an HTTP request.
func callRequest(ctx context.Context, method string) *http.Request {
	h := mdHeader(ctx)
	host := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if a := md.Get(":authority"); len(a) > 0 {
			host = a[0]
		}
	}
	addr := peerAddr(ctx)
	if _, _, err := net.SplitHostPort(addr); err != nil && addr != "" {
		addr = net.JoinHostPort(addr, "0")
	}
	return &http.Request{
		Method:     http.MethodPost,
		URL:        &url.URL{Path: method},
		Host:       host,
		Header:     h,
		RemoteAddr: addr,
		Proto:      "HTTP/2.0", ProtoMajor: 2,
	}
}

// Package grpclimit puts a weir rate limit in front of gRPC servers: unary
// and stream server interceptors that apply one weir.Limit (New). The
// rules of a policy loaded from weir.yaml are package grpcpolicy's, so
// that a program with one limit links neither weir.yaml's parser nor its
// file watcher.
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
// with codes.Unavailable (WithErrorPolicy(httplimit.FailClosed)).
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/grpclimit/internal/intercept"
	"github.com/weir-dev/weir/httplimit"
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

// Option configures an Interceptor, or grpcpolicy's.
type Option func(*config)

// config is shared with grpcpolicy, which takes the same options.
type config = intercept.Config

// WithName names the rule New applies, in store keys and headers. The
// default is DefaultName.
func WithName(rule string) Option { return func(c *config) { c.Name = rule } }

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
		c.Trusted = trusted
		c.Key = nil
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
			c.IPHeader = clientip.ForwardedFor
			return
		}
		h, ok := clientip.CanonicalHeader(name)
		if !ok {
			c.Err = fmt.Errorf("WithClientIPHeader(%q): not a metadata key", name)
			return
		}
		c.IPHeader = h
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
	return func(c *config) { c.Key = fn }
}

// WithErrorPolicy says what New does with a call when the store fails:
// httplimit.FailOpen (the default) lets it through, httplimit.FailClosed
// ends it with codes.Unavailable. For grpcpolicy.New it applies only while
// the getter returns no policy; rules choose with on_error.
func WithErrorPolicy(p httplimit.ErrorPolicy) Option {
	return func(c *config) { c.ErrorPolicy = p }
}

// WithHeaderFormatter replaces the draft headers with f's; the header
// names f writes become metadata keys in lower case.
func WithHeaderFormatter(f httplimit.HeaderFormatter) Option {
	return func(c *config) { c.Formatter = f }
}

// WithSleep replaces the timer that holds shaped calls (see
// httplimit.WithSleep).
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *config) { c.Sleep = sleep }
}

// Interceptor applies a limit to gRPC calls. Its Unary and Stream methods
// return the server interceptors; both share its state.
type Interceptor struct {
	c     *config
	lim   *weir.Limiter
	limit weir.Limit
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
	return &Interceptor{c: intercept.NewConfig("grpclimit", DefaultName, opts), lim: lim, limit: l}
}

// Unary returns the unary server interceptor.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor { return intercept.Unary(ic.admit) }

// Stream returns the stream server interceptor. A concurrency lease is
// held until the stream's handler returns, that is, until the stream ends.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor { return intercept.Stream(ic.admit) }

// admit decides the call; on admission it returns the function that
// releases what the call holds.
func (ic *Interceptor) admit(ctx context.Context, method string, out intercept.Sink) (func(codes.Code), error) {
	c := ic.c
	var id string
	if c.Key != nil {
		k, err := c.Key(ctx, method)
		if err != nil {
			if errors.Is(err, httplimit.ErrNoLimit) {
				return intercept.Noop, nil
			}
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		id = k
	} else {
		id = ic.peerKey(ctx)
	}
	key := weir.Key(c.Name, id)
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
		if c.ErrorPolicy == httplimit.FailClosed {
			return nil, status.Error(codes.Unavailable, "rate limiter unavailable")
		}
		return intercept.Noop, nil
	}
	st := []httplimit.Status{{Rule: c.Name, Limit: ic.limit, Result: res}}
	if !res.Allowed {
		return nil, c.Reject(out, st, 0, res.RetryAfter)
	}
	release := intercept.Noop
	if lease != nil {
		release = func(codes.Code) { _ = lease.Release(context.WithoutCancel(ctx)) }
	}
	_ = out.SetHeader(c.MD(st, 0))
	if res.Delay > 0 {
		if err := c.Sleep(ctx, res.Delay); err != nil {
			s := status.FromContextError(err)
			release(s.Code())
			return nil, s.Err()
		}
	}
	return release, nil
}

// peerKey is the client-address key of the call: the peer, or the address
// a trusted proxy forwarded in the metadata, grouped as KeyByIP groups.
func (ic *Interceptor) peerKey(ctx context.Context) string {
	r := http.Request{RemoteAddr: intercept.PeerAddr(ctx)}
	if len(ic.c.Trusted) > 0 {
		r.Header = intercept.MDHeader(ctx)
	}
	a := clientip.From(&r, ic.c.Trusted, ic.c.IPHeader)
	if !a.IsValid() {
		return r.RemoteAddr
	}
	return string(clientip.AppendGroup(nil, a, 32, clientip.DefaultIPv6Bits))
}

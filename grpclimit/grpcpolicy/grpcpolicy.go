// Package grpcpolicy puts the rules of a weir.yaml policy in front of gRPC
// servers: unary and stream server interceptors, as grpclimit's for one
// limit, which take grpclimit's options. It is the gRPC counterpart of
// policy.Middleware, in a package of its own so that grpclimit, for one
// limit, links neither package policy nor its YAML parser and file
// watcher, and so that policy links no gRPC.
//
//	p, err := policy.New(cfg, store)
//	ic := grpcpolicy.New(func() *policy.Policy { return p }) // or a policy.Watch Holder's Load
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
//
// Each call is presented to the policy as an HTTP request: method POST,
// path the full method name ("/pkg.Service/Method"), host the :authority,
// headers the metadata (binary "-bin" keys left out), remote address the
// peer. So rules match by path, identities may be ip (trusted_proxies and
// client_ip_header honoured: behind Envoy set client_ip_header:
// X-Forwarded-For), header or route, and allow and deny lists apply; a
// deny-listed call ends with codes.PermissionDenied. A rejected call ends
// as grpclimit's do (codes.ResourceExhausted, RetryInfo, the rate-limit
// trailers), and a rule's on_error decides when the store fails.
//
// A count: {status: [...]} rule takes its cost before the handler and
// gives it back when the call ends with a code whose HTTP status it does
// not count. Codes map to statuses as Google APIs and grpc-gateway map
// them: OK 200; InvalidArgument, FailedPrecondition and OutOfRange 400;
// Unauthenticated 401; PermissionDenied 403; NotFound 404; AlreadyExists
// and Aborted 409; ResourceExhausted 429; Canceled 499; Unknown, Internal,
// DataLoss and any other code 500; Unimplemented 501; Unavailable 503;
// DeadlineExceeded 504. A handler that panics ends as Internal. A cost:
// rule takes its cost (a constant, or a metadata value for header:NAME)
// before the handler and keeps it: a gRPC handler has no
// httplimit.Charge; a cost: value that is no whole number the rule admits
// ends the call with codes.InvalidArgument.
package grpcpolicy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/grpclimit"
	"github.com/weir-dev/weir/grpclimit/internal/intercept"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
)

// Interceptor applies a policy's rules to gRPC calls. Its Unary and Stream
// methods return the server interceptors; both share its state.
type Interceptor struct {
	c   *intercept.Config
	get func() *policy.Policy
}

// New returns an Interceptor applying the rules of the policy get
// returns, called once per call, so that a reloading holder
// (policy.Watch's Load) can swap rule sets. Of grpclimit's options,
// WithErrorPolicy (while get returns no policy), WithHeaderFormatter and
// WithSleep apply; WithName, KeyByPeer, WithClientIPHeader, KeyByMetadata
// and WithKey do not: the rules name themselves and their identities. It
// panics if get is nil or an option is bad: programming errors found at
// start-up.
func New(get func() *policy.Policy, opts ...grpclimit.Option) *Interceptor {
	if get == nil {
		panic("grpcpolicy: New with a nil getter")
	}
	return &Interceptor{c: intercept.NewConfig("grpcpolicy", grpclimit.DefaultName, opts), get: get}
}

// Unary returns the unary server interceptor.
func (ic *Interceptor) Unary() grpc.UnaryServerInterceptor { return intercept.Unary(ic.admit) }

// Stream returns the stream server interceptor. What a call holds (a
// concurrency lease, a count rule's cost) is held until the stream's
// handler returns, that is, until the stream ends, and settled by the
// code it ends with.
func (ic *Interceptor) Stream() grpc.StreamServerInterceptor { return intercept.Stream(ic.admit) }

// admit decides the call; on admission it returns the function that
// settles and releases what the call holds, given the code the call ended
// with.
func (ic *Interceptor) admit(ctx context.Context, method string, out intercept.Sink) (func(codes.Code), error) {
	p := ic.get()
	if p == nil {
		if ic.c.ErrorPolicy == httplimit.FailClosed {
			return nil, status.Error(codes.Unavailable, "no rate-limit policy loaded")
		}
		return intercept.Noop, nil
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
		return nil, ic.c.Reject(out, statuses, limiting, retry)
	}
	if len(statuses) > 0 {
		_ = out.SetHeader(ic.c.MD(statuses, limiting))
	}
	var delay time.Duration
	for i := range v.Results {
		if rr := &v.Results[i]; !rr.Shadow && !rr.Skipped {
			delay = max(delay, rr.Result.Delay)
		}
	}
	if delay > 0 {
		if err := ic.c.Sleep(ctx, delay); err != nil {
			s := status.FromContextError(err)
			finish(s.Code())
			return nil, s.Err()
		}
	}
	return finish, nil
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

// callRequest presents a call to a policy as an HTTP request.
func callRequest(ctx context.Context, method string) *http.Request {
	h := intercept.MDHeader(ctx)
	host := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if a := md.Get(":authority"); len(a) > 0 {
			host = a[0]
		}
	}
	addr := intercept.PeerAddr(ctx)
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

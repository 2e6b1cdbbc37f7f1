// Package intercept is what grpclimit's interceptors and grpcpolicy's
// share: the options' configuration, the unary and stream wrappers that
// settle a call by the code it ends with, and the rate-limit metadata.
package intercept

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/internal/waitctx"
)

// Config is what grpclimit's options set.
type Config struct {
	Name        string
	Key         func(ctx context.Context, fullMethod string) (string, error)
	Trusted     []netip.Prefix
	IPHeader    string
	ErrorPolicy httplimit.ErrorPolicy
	Formatter   httplimit.HeaderFormatter
	Sleep       func(context.Context, time.Duration) error
	Err         error // a bad option's
}

// NewConfig applies opts to the defaults, with name as the rule's name.
// It panics, naming pkg, if an option is bad: a programming error found
// at start-up.
func NewConfig[O ~func(*Config)](pkg, name string, opts []O) *Config {
	c := &Config{Name: name, IPHeader: clientip.ForwardedFor, Sleep: waitctx.Sleep}
	for _, o := range opts {
		o(c)
	}
	if c.Err != nil {
		panic(pkg + ": " + c.Err.Error())
	}
	return c
}

// Sink is where the rate-limit metadata goes: the unary call's context
// (grpc.SetHeader, grpc.SetTrailer) or the stream.
type Sink interface {
	SetHeader(metadata.MD) error
	SetTrailer(metadata.MD)
}

type grpcSink struct{ ctx context.Context }

func (s grpcSink) SetHeader(md metadata.MD) error { return grpc.SetHeader(s.ctx, md) }
func (s grpcSink) SetTrailer(md metadata.MD)      { _ = grpc.SetTrailer(s.ctx, md) }

// Admit decides a call to method; on admission it returns the function
// that settles and releases what the call holds, given the code the call
// ended with.
type Admit func(ctx context.Context, method string, out Sink) (finish func(codes.Code), err error)

// Noop is the finish of a call that holds nothing.
func Noop(codes.Code) {}

// Unary returns the unary server interceptor that admits calls with admit.
func Unary(admit Admit) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		finish, err := admit(ctx, info.FullMethod, grpcSink{ctx})
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

// Stream returns the stream server interceptor that admits calls with
// admit. What a call holds is held until the stream's handler returns,
// that is, until the stream ends.
func Stream(admit Admit) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		finish, err := admit(ss.Context(), info.FullMethod, ss)
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

// Reject builds the ResourceExhausted status with its RetryInfo and sets
// the rate-limit trailers.
func (c *Config) Reject(out Sink, st []httplimit.Status, limiting int, retry time.Duration) error {
	out.SetTrailer(c.MD(st, limiting))
	s := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit exceeded, retry in %v", retry))
	if d, err := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		s = d
	}
	return s.Err()
}

// MD renders the rate-limit headers as metadata.
func (c *Config) MD(st []httplimit.Status, limiting int) metadata.MD {
	h := make(http.Header, 3)
	httplimit.WriteHeaders(h, st, limiting, c.Formatter)
	md := make(metadata.MD, len(h))
	for k, v := range h {
		md[strings.ToLower(k)] = v
	}
	return md
}

// PeerAddr is the call's peer address, "unix" for a Unix socket, or "".
func PeerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if p.Addr.Network() == "unix" {
			return "unix"
		}
		return p.Addr.String()
	}
	return ""
}

// MDHeader converts the incoming metadata into an http.Header, binary
// values and pseudo-headers left out.
func MDHeader(ctx context.Context) http.Header {
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

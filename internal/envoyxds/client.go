// Package envoyxds subscribes to envoyproxy/ratelimit's configuration over
// xDS, as that service does with CONFIG_TYPE=GRPC_XDS_SOTW: one aggregated
// (ADS) state-of-the-world stream of RateLimitConfig resources from a
// management server such as Envoy Gateway's.
package envoyxds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// TypeURL is the xDS type of envoyproxy/ratelimit's configuration.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Options says where to subscribe and how.
type Options struct {
	// Server is the management server's host:port (a gRPC target).
	Server string
	// NodeID and NodeMetadata identify this client; the server picks its
	// snapshot by the node ID.
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent as gRPC metadata on the stream.
	Headers map[string]string
	// TLS, when not nil, secures the connection (with a client
	// certificate for mutual TLS); nil connects in plaintext.
	TLS *tls.Config
	// RetryMin and RetryMax bound the wait between attempts after the
	// stream fails: it starts at RetryMin and doubles up to RetryMax, with
	// jitter. Zero values mean 1s and 30s.
	RetryMin, RetryMax time.Duration
	// MaxMessageBytes bounds a received message; 0 is gRPC's default (4 MiB).
	MaxMessageBytes int
	// MergeDomains lets several resources define the same domain, merged
	// in the order received (weir serve's --envoy-merge-domains, the
	// peer's MERGE_DOMAIN_CONFIG); without it such an update is refused.
	MergeDomains bool
	// Log receives one line per accepted or refused update and per
	// broken stream; nil is slog.Default().
	Log *slog.Logger
}

// Apply puts a configuration in force. Run calls it with every update the
// server sends that loads without error, and ACKs it.
type Apply func(*envoyrls.Config)

// Run subscribes until ctx ends, then returns nil. Every response is
// loaded as a whole: if every resource decodes and the documents load
// together, apply gets the new configuration and the response is ACKed;
// otherwise it is NACKed with the reason and the configuration in force
// stays. When the stream breaks, Run waits (with backoff) and subscribes
// again; the configuration in force stays meanwhile.
func Run(ctx context.Context, o Options, apply Apply) error {
	if o.Server == "" {
		return errors.New("envoyxds: no management server address")
	}
	if o.RetryMin <= 0 {
		o.RetryMin = time.Second
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(30*time.Second, o.RetryMin)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.MaxMessageBytes > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMessageBytes)))
	}
	conn, err := grpc.NewClient(o.Server, dopts...)
	if err != nil {
		return fmt.Errorf("envoyxds: management server %q: %w", o.Server, err)
	}
	defer conn.Close()
	if len(o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(o.Headers))
	}
	c := &client{o: o, apply: apply, ads: discoveryv3.NewAggregatedDiscoveryServiceClient(conn), node: node(o)}
	wait := o.RetryMin
	for {
		got, err := c.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			wait = o.RetryMin // it worked for a while: start the backoff again
		}
		d := wait/2 + rand.N(wait/2+1) // jitter: between half and all of wait
		o.Log.Warn("envoyxds: stream to the management server broke; the configuration in force stays", "server", o.Server, "err", err, "retry_in", d.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		wait = min(wait*2, o.RetryMax)
	}
}

type client struct {
	o     Options
	apply Apply
	ads   discoveryv3.AggregatedDiscoveryServiceClient
	node  *corev3.Node
	// version is the last version accepted, sent with every NACK.
	version string
}

func node(o Options) *corev3.Node {
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range o.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	return &corev3.Node{Id: o.NodeID, Metadata: md}
}

// stream runs one ADS stream until it fails; got reports whether it
// received anything.
func (c *client) stream(ctx context.Context) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ads.StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	// A new stream asks afresh (no version), so that a restarted server,
	// whose versions may restart too, sends its current snapshot.
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL}); err != nil {
		return false, err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		req := &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		cfg, lerr := load(resp, envoyrls.LoadOptions{MergeDomains: c.o.MergeDomains})
		if lerr != nil {
			req.VersionInfo = c.version
			req.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: lerr.Error()}
			c.o.Log.Error("envoyxds: update refused (NACK); the configuration in force stays", "version", resp.GetVersionInfo(), "err", lerr)
		} else {
			c.apply(cfg)
			c.version = resp.GetVersionInfo()
			req.VersionInfo = c.version
			c.o.Log.Info("envoyxds: update applied (ACK)", "version", c.version, "domains", len(cfg.Domains()))
		}
		if err := st.Send(req); err != nil {
			return got, err
		}
	}
}

// Load decodes a response's RateLimitConfig resources and loads them as
// one configuration, each resource a document named after it.
func Load(resp *discoveryv3.DiscoveryResponse) (*envoyrls.Config, error) {
	return load(resp, envoyrls.LoadOptions{})
}

// load is Load with the loader's options.
func load(resp *discoveryv3.DiscoveryResponse, o envoyrls.LoadOptions) (*envoyrls.Config, error) {
	if t := resp.GetTypeUrl(); t != TypeURL {
		return nil, fmt.Errorf("envoyxds: response of type %q, want %q", t, TypeURL)
	}
	docs := make([]envoyrls.Document, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("envoyxds: resource %d is of type %q, want %q", i, a.GetTypeUrl(), TypeURL)
		}
		var rc rlsconfv3.RateLimitConfig
		if err := a.UnmarshalTo(&rc); err != nil {
			return nil, fmt.Errorf("envoyxds: resource %d: %w", i, err)
		}
		data, err := toYAML(&rc)
		if err != nil {
			return nil, fmt.Errorf("envoyxds: resource %q: %w", rc.GetName(), err)
		}
		name := rc.GetName()
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		docs = append(docs, envoyrls.Document{Name: "xds:" + name, Data: data})
	}
	return envoyrls.LoadDocumentsWith(o, docs...)
}

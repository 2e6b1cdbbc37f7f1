package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/weir-dev/weir/internal/envoyxds"
	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// compatFlags are weir serve's settings for standing in for
// envoyproxy/ratelimit: its environment, its xDS subscription, its
// plaintext /healthcheck beside a TLS gRPC port, its metrics listener.
type compatFlags struct {
	compat                            bool
	mergeDomains                      bool // --envoy-merge-domains, for the xDS loader
	xds, xdsNode, xdsNodeMeta         string
	xdsHeaders                        string
	xdsTLS                            bool
	xdsCert, xdsKey, xdsCA, xdsServer string
	xdsRetryMin, xdsRetryMax          time.Duration
	xdsMaxMsg                         int
	awaitConfig, tlsGRPCOnly          bool
	metricsAddr, metricsPath          string
}

func addCompatFlags(fs *flag.FlagSet, c *compatFlags) {
	fs.BoolVar(&c.compat, "envoy-compat", false, "stand in for envoyproxy/ratelimit: read its environment variables (REDIS_URL, PORT, CONFIG_TYPE, ...) as it does, refusing to start on one weir cannot honour; on when weir runs as /bin/ratelimit (docs/envoy.md)")
	fs.StringVar(&c.xds, "envoy-xds", "", "subscribe to the Envoy config over xDS (RateLimitConfig resources, state of the world) from the management server at host:port, instead of --envoy-config")
	fs.StringVar(&c.xdsNode, "envoy-xds-node", "default", "xDS node ID: the management server picks the snapshot by it")
	fs.StringVar(&c.xdsNodeMeta, "envoy-xds-node-metadata", "", "xDS node metadata: key=value,key=value")
	fs.StringVar(&c.xdsHeaders, "envoy-xds-headers", "", "gRPC metadata sent to the management server: key:value,key:value")
	fs.BoolVar(&c.xdsTLS, "envoy-xds-tls", false, "connect to the management server over TLS")
	fs.StringVar(&c.xdsCert, "envoy-xds-cert", "", "PEM client certificate presented to the management server (mutual TLS)")
	fs.StringVar(&c.xdsKey, "envoy-xds-key", "", "PEM key of --envoy-xds-cert")
	fs.StringVar(&c.xdsCA, "envoy-xds-ca", "", "PEM CA bundle the management server's certificate must chain to, beside the system roots")
	fs.StringVar(&c.xdsServer, "envoy-xds-server-name", "", "name the management server's certificate must carry (default: the host of --envoy-xds)")
	fs.DurationVar(&c.xdsRetryMin, "envoy-xds-retry-min", time.Second, "first wait before subscribing again after the xDS stream breaks; it doubles, with jitter")
	fs.DurationVar(&c.xdsRetryMax, "envoy-xds-retry-max", 30*time.Second, "longest wait before subscribing again")
	fs.IntVar(&c.xdsMaxMsg, "envoy-xds-max-message-bytes", 0, "largest xDS message accepted (default: gRPC's 4 MiB)")
	fs.BoolVar(&c.awaitConfig, "envoy-await-config", false, "GET /healthcheck answers 500 until the first Envoy config arrives over xDS")
	fs.BoolVar(&c.tlsGRPCOnly, "tls-grpc-only", false, "with --tls-cert, only the gRPC listener speaks TLS; HTTP (/healthcheck for probes) stays plaintext")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", `also serve the Prometheus metrics on this address, e.g. ":19001"`)
	fs.StringVar(&c.metricsPath, "metrics-path", "/metrics", "path of the metrics on --metrics-addr")
}

// compatOptions are the server options of c.
func compatOptions(c *compatFlags, envoyConfig string) ([]server.Option, error) {
	var opts []server.Option
	if c.xds != "" {
		if envoyConfig != "" {
			return nil, fmt.Errorf("--envoy-xds %s and --envoy-config %s: the Envoy config comes from one or the other", c.xds, envoyConfig)
		}
		// No rules until the first update: an empty config, which also
		// keeps the server off its demo rules.
		empty, err := envoyrls.LoadDocuments()
		if err != nil {
			return nil, err
		}
		opts = append(opts, server.WithEnvoyConfig(empty))
	}
	if c.awaitConfig {
		if c.xds == "" {
			return nil, errors.New("--envoy-await-config needs --envoy-xds")
		}
		opts = append(opts, server.WithEnvoyAwaitConfig())
	}
	if c.tlsGRPCOnly {
		opts = append(opts, server.WithTLSOnGRPCOnly())
	}
	return opts, nil
}

// xdsOptions are the xDS client's options for c, its files read.
func xdsOptions(c *compatFlags, log *slog.Logger) (envoyxds.Options, error) {
	o := envoyxds.Options{Server: c.xds, NodeID: c.xdsNode, RetryMin: c.xdsRetryMin, RetryMax: c.xdsRetryMax,
		MaxMessageBytes: c.xdsMaxMsg, MergeDomains: c.mergeDomains, Log: log}
	var err error
	if o.NodeMetadata, err = pairs(c.xdsNodeMeta, "=", "--envoy-xds-node-metadata"); err != nil {
		return o, err
	}
	if o.Headers, err = pairs(c.xdsHeaders, ":", "--envoy-xds-headers"); err != nil {
		return o, err
	}
	if !c.xdsTLS {
		if c.xdsCert != "" || c.xdsKey != "" || c.xdsCA != "" {
			return o, errors.New("--envoy-xds-cert, --envoy-xds-key and --envoy-xds-ca need --envoy-xds-tls")
		}
		return o, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.xdsServer}
	if (c.xdsCert == "") != (c.xdsKey == "") {
		return o, fmt.Errorf("--envoy-xds-cert %q and --envoy-xds-key %q: give both or neither", c.xdsCert, c.xdsKey)
	}
	if c.xdsCert != "" {
		pair, err := tls.LoadX509KeyPair(c.xdsCert, c.xdsKey)
		if err != nil {
			return o, fmt.Errorf("--envoy-xds-cert %s: %w", c.xdsCert, err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	if c.xdsCA != "" {
		pem, err := os.ReadFile(c.xdsCA)
		if err != nil {
			return o, fmt.Errorf("--envoy-xds-ca: %w", err)
		}
		pool, _ := x509.SystemCertPool()
		if pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return o, fmt.Errorf("--envoy-xds-ca %s: no PEM certificate in it", c.xdsCA)
		}
		t.RootCAs = pool
	}
	o.TLS = t
	return o, nil
}

// pairs parses "k<sep>v,k<sep>v"; flag names the setting in errors.
func pairs(s, sep, flag string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, e := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(e, sep)
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s: entry %q is not key%svalue", flag, e, sep)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// startCompat starts what c asks beside srv until ctx ends: the xDS
// subscription and the metrics listener. stop closes the listener.
func startCompat(ctx context.Context, c *compatFlags, srv *server.Server, log *slog.Logger) (stop func(), err error) {
	stop = func() {}
	if c.xds != "" {
		o, err := xdsOptions(c, log)
		if err != nil {
			return stop, err
		}
		go func() {
			if err := envoyxds.Run(ctx, o, srv.SetEnvoyConfig); err != nil {
				log.Error("weir serve: no xDS subscription; the Envoy config stays empty", "err", err)
			}
		}()
		log.Info("weir serve: subscribing to the Envoy config over xDS", "server", c.xds, "node", c.xdsNode, "tls", c.xdsTLS)
	}
	if c.metricsAddr != "" {
		if !strings.HasPrefix(c.metricsPath, "/") {
			return stop, fmt.Errorf("--metrics-path %q: want a path starting with /", c.metricsPath)
		}
		l, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			return stop, fmt.Errorf("--metrics-addr %s: %w", c.metricsAddr, err)
		}
		h := srv.Handler()
		mux := http.NewServeMux()
		mux.HandleFunc("GET "+c.metricsPath, func(w http.ResponseWriter, r *http.Request) {
			r2 := r.Clone(r.Context())
			r2.URL.Path, r2.URL.RawPath = "/metrics", ""
			h.ServeHTTP(w, r2)
		})
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go ms.Serve(l)
		stop = func() { ms.Close() }
	}
	return stop, nil
}

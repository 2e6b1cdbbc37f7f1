package server

import (
	"crypto/tls"
	"fmt"

	"github.com/weir-dev/weir/internal/tlsfiles"
	"github.com/weir-dev/weir/policy/config"
)

// WithTLS makes the HTTP and gRPC listeners speak TLS only, with the
// certificate and key in the PEM files certFile and keyFile; a clientCA
// file turns on mutual TLS (clients must present a certificate that chains
// to it). The files are re-read when they change, so a rotated
// certificate is served from the next handshake on, without a restart. It
// overrides the config's server.tls.
func WithTLS(certFile, keyFile, clientCA string) Option {
	return func(o *options) { o.tls = &config.ServerTLSConfig{Cert: certFile, Key: keyFile, ClientCA: clientCA} }
}

// initTLS reads the listeners' certificate, if WithTLS or server.tls
// names one.
func (s *Server) initTLS(cfg *config.Config) error {
	t := cfg.Server.TLS
	if s.o.tls != nil {
		t = *s.o.tls
	}
	if t.Cert == "" && t.Key == "" && t.ClientCA == "" {
		return nil
	}
	if t.Cert == "" || t.Key == "" {
		return fmt.Errorf("server: TLS needs a certificate and its key (cert %q, key %q)", t.Cert, t.Key)
	}
	src, err := tlsfiles.New(t.Cert, t.Key, t.ClientCA)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.tls = src
	return nil
}

// TLS reports whether the listeners speak TLS, and whether they require
// client certificates (mutual TLS).
func (s *Server) TLS() (on, mutual bool) {
	if s.tls == nil {
		return false, false
	}
	return true, s.tls.HasCA()
}

// httpTLS and grpcTLS are the listeners' configs: HTTP offers HTTP/2 and
// HTTP/1.1 by ALPN, gRPC HTTP/2.
func (s *Server) httpTLS() *tls.Config { return s.tls.ServerConfig([]string{"h2", "http/1.1"}) }
func (s *Server) grpcTLS() *tls.Config { return s.tls.ServerConfig([]string{"h2"}) }

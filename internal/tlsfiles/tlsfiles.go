// Package tlsfiles serves TLS certificates from PEM files that are replaced
// while the process runs, as cert-manager and similar tools do: the files
// are stat'ed on every handshake and read again when their modification
// time, size or inode changed. A half-written rotation (a new certificate with
// the old key) is not taken: the previous pair stays in use until both
// files agree.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Source is a certificate and key pair, and optionally a CA bundle, read
// from files and re-read when they change. It is safe for concurrent use.
type Source struct {
	certPath, keyPath, caPath string

	mu       sync.Mutex
	pairSeen [2]stamp
	pair     *tls.Certificate
	caSeen   stamp
	pool     *x509.CertPool
	lastErr  error
}

// stamp identifies a version of a file.
type stamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

func stat(path string) (stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}, err
	}
	return stamp{fi.ModTime(), fi.Size(), inode(fi)}, nil
}

// New reads the files: certPath and keyPath (both or neither) and caPath
// (optional). Its errors name the file at fault.
func New(certPath, keyPath, caPath string) (*Source, error) {
	if (certPath == "") != (keyPath == "") {
		return nil, fmt.Errorf("tls: a certificate needs its key and a key its certificate (cert %q, key %q)", certPath, keyPath)
	}
	s := &Source{certPath: certPath, keyPath: keyPath, caPath: caPath}
	if certPath != "" {
		if err := s.loadPair(); err != nil {
			return nil, err
		}
	}
	if caPath != "" {
		if err := s.loadCA(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// HasCert reports whether the source has a certificate and key.
func (s *Source) HasCert() bool { return s.certPath != "" }

// HasCA reports whether the source has a CA bundle.
func (s *Source) HasCA() bool { return s.caPath != "" }

func (s *Source) loadPair() error {
	cs, err := stat(s.certPath)
	if err != nil {
		return fmt.Errorf("tls: certificate %s: %w", s.certPath, err)
	}
	ks, err := stat(s.keyPath)
	if err != nil {
		return fmt.Errorf("tls: key %s: %w", s.keyPath, err)
	}
	pair, err := tls.LoadX509KeyPair(s.certPath, s.keyPath)
	if err != nil {
		return fmt.Errorf("tls: certificate %s with key %s: %w", s.certPath, s.keyPath, err)
	}
	s.pair, s.pairSeen = &pair, [2]stamp{cs, ks}
	return nil
}

func (s *Source) loadCA() error {
	st, err := stat(s.caPath)
	if err != nil {
		return fmt.Errorf("tls: CA bundle %s: %w", s.caPath, err)
	}
	pem, err := os.ReadFile(s.caPath)
	if err != nil {
		return fmt.Errorf("tls: CA bundle %s: %w", s.caPath, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("tls: CA bundle %s: no PEM certificate in it", s.caPath)
	}
	s.pool, s.caSeen = pool, st
	return nil
}

// refresh re-reads the files that changed since they were read. A file
// that cannot be read, or a pair that does not match, keeps what was read
// before; LastError reports why.
func (s *Source) refresh() {
	var errs []error
	if s.certPath != "" {
		cs, cerr := stat(s.certPath)
		ks, kerr := stat(s.keyPath)
		if cerr == nil && kerr == nil && [2]stamp{cs, ks} != s.pairSeen {
			errs = append(errs, s.loadPair())
		} else {
			errs = append(errs, cerr, kerr)
		}
	}
	if s.caPath != "" {
		st, err := stat(s.caPath)
		if err == nil && st != s.caSeen {
			err = s.loadCA()
		}
		errs = append(errs, err)
	}
	s.lastErr = errors.Join(errs...)
}

// Certificate returns the current certificate, re-reading the files if
// they changed.
func (s *Source) Certificate() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.certPath == "" {
		return nil, errors.New("tls: no certificate configured")
	}
	s.refresh()
	return s.pair, nil
}

// Pool returns the current CA pool (nil without a CA bundle), re-reading
// the file if it changed.
func (s *Source) Pool() *x509.CertPool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refresh()
	return s.pool
}

// LastError reports why the last re-read failed (nil if it did not): the
// previous certificate stays in use meanwhile.
func (s *Source) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// ServerConfig returns a server-side config that presents the current
// certificate and, with a CA bundle, requires and verifies client
// certificates against it (mutual TLS). nextProtos is the ALPN list.
func (s *Source) ServerConfig(nextProtos []string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		// Every handshake gets the files' current content.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.refresh()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{*s.pair},
			}
			if s.pool != nil {
				c.ClientCAs = s.pool
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// ClientConfig returns a client-side config: it trusts the CA bundle (the
// system's roots without one), presents the current certificate when the
// server asks for one (if the source has one), and checks the server's
// name against serverName (the dialled host when empty).
func (s *Source) ClientConfig(serverName string) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, RootCAs: s.pool}
	if s.certPath != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.Certificate()
		}
	}
	return c
}

// AnyName returns a copy of c, a client config, that verifies the
// server's certificate chain against c.RootCAs (the system's roots when
// nil) as c would, but not the server's name: envoyproxy/ratelimit's
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION. A certificate from another CA is
// still refused.
func AnyName(c *tls.Config) *tls.Config {
	c = c.Clone()
	roots := c.RootCAs
	// The standard verification is off only to be replaced by the same
	// one without the name; VerifyConnection runs on every handshake,
	// resumed ones included.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server presented no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("tls: the server's certificate: %w", err)
		}
		return nil
	}
	return c
}

// Package certtest makes throw-away certificates for tests: a CA, a
// certificate for 127.0.0.1 and localhost usable by servers and clients,
// and a client certificate, written as PEM files into a test's directory.
// Nothing it makes is committed or outlives the test.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Files are the PEM files of a test PKI.
type Files struct {
	Dir string
	// CA is the CA's certificate, which signed all the others.
	CA string
	// Cert and Key are a certificate for 127.0.0.1 and localhost, valid
	// for servers and clients (redis-server uses it both ways).
	Cert, Key string
	// ClientCert and ClientKey are a client-only certificate.
	ClientCert, ClientKey string

	t      testing.TB
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

var serial atomic.Int64

// New makes a CA and its certificates in a new temporary directory.
func New(t testing.TB) *Files {
	t.Helper()
	dir := t.TempDir()
	f := &Files{Dir: dir, t: t,
		CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem")}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: "weir test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("certtest: CA: %v", err)
	}
	f.caCert, _ = x509.ParseCertificate(der)
	f.caKey = key
	writePEM(t, f.CA, "CERTIFICATE", der)
	f.Issue(f.Cert, f.Key, "weir test server", true)
	f.Issue(f.ClientCert, f.ClientKey, "weir test client", false)
	return f
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("certtest: key: %v", err)
	}
	return key
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	// Write then rename, so that a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("certtest: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("certtest: %v", err)
	}
}

// Issue writes a new certificate named cn, signed by the CA, and its key
// to certPath and keyPath (replacing them: a rotation); server makes it
// valid for 127.0.0.1 and localhost as a server, and as a client too. It
// returns the certificate's serial number.
func (f *Files) Issue(certPath, keyPath, cn string, server bool) *big.Int {
	f.t.Helper()
	key := newKey(f.t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.caCert, &key.PublicKey, f.caKey)
	if err != nil {
		f.t.Fatalf("certtest: %s: %v", cn, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		f.t.Fatalf("certtest: %v", err)
	}
	writePEM(f.t, keyPath, "PRIVATE KEY", kder)
	writePEM(f.t, certPath, "CERTIFICATE", der)
	return tmpl.SerialNumber
}

// Pool returns a pool holding the CA.
func (f *Files) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(f.caCert)
	return p
}

// ClientConfig returns a client config that trusts the CA and, when
// withCert, presents the client certificate.
func (f *Files) ClientConfig(withCert bool) *tls.Config {
	f.t.Helper()
	c := &tls.Config{RootCAs: f.Pool(), MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			f.t.Fatalf("certtest: %v", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c
}

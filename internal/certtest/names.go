package certtest

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"time"
)

// IssueFor is Issue for a server and client certificate valid for the
// DNS names given as well as for 127.0.0.1 and localhost: a service
// reached by its name from a container, say.
func (f *Files) IssueFor(certPath, keyPath, cn string, names ...string) *big.Int {
	f.t.Helper()
	key := newKey(f.t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     append([]string{"localhost"}, names...),
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

// IssueNamedOnly is IssueFor without 127.0.0.1 and localhost: a
// certificate whose names a client dialling 127.0.0.1 does not find.
func (f *Files) IssueNamedOnly(certPath, keyPath, cn string, names ...string) {
	f.t.Helper()
	key := newKey(f.t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
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
}

package tlsfiles_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/tlsfiles"
)

func serialOf(t *testing.T, c *tls.Certificate) string {
	t.Helper()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber.String()
}

// TestRotation: the client side presents the rotated certificate from the
// next handshake on; a half-written pair keeps the previous one and says
// why; an unreadable file at start is an error naming it.
func TestRotation(t *testing.T) {
	pki := certtest.New(t)
	src, err := tlsfiles.New(pki.ClientCert, pki.ClientKey, pki.CA)
	if err != nil {
		t.Fatal(err)
	}
	cfg := src.ClientConfig("")
	if cfg.RootCAs == nil || cfg.GetClientCertificate == nil {
		t.Fatal("client config without the CA or the certificate")
	}
	first, _ := cfg.GetClientCertificate(nil)
	s1 := serialOf(t, first)
	s2 := pki.Issue(pki.ClientCert, pki.ClientKey, "rotated", false).String()
	second, _ := cfg.GetClientCertificate(nil)
	if serialOf(t, second) != s2 || s2 == s1 {
		t.Fatalf("after rotation: serial %s, want %s (was %s)", serialOf(t, second), s2, s1)
	}
	// Only a new key lands: the pair does not match, the old one stays.
	certtest.New(t).Issue(pki.Dir+"/other.pem", pki.ClientKey, "stray", false)
	third, _ := cfg.GetClientCertificate(nil)
	if serialOf(t, third) != s2 || src.LastError() == nil {
		t.Fatalf("half-written rotation: serial %s (want %s), LastError %v", serialOf(t, third), s2, src.LastError())
	}
	if _, err := tlsfiles.New(pki.ClientCert, pki.Dir+"/nope.pem", ""); err == nil || !strings.Contains(err.Error(), "nope.pem") {
		t.Fatalf("missing key: %v", err)
	}
	os.WriteFile(pki.Dir+"/empty.pem", nil, 0o600)
	if _, err := tlsfiles.New("", "", pki.Dir+"/empty.pem"); err == nil || !strings.Contains(err.Error(), "empty.pem") {
		t.Fatalf("empty CA: %v", err)
	}
}

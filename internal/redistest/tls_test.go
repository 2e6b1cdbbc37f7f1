package redistest_test

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/redistest"
)

// TestStandaloneTLS: the TLS server answers over TLS with a client
// certificate, and refuses plaintext and certificate-less clients.
func TestStandaloneTLS(t *testing.T) {
	pki := certtest.New(t)
	s := redistest.StandaloneTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
	if v, err := s.Do("SET", "k", "v"); err != nil || v != "OK" {
		t.Fatalf("SET over TLS: %v %v", v, err)
	}
	// Without a client certificate the handshake (or the first read) fails.
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.Addr, pki.ClientConfig(false))
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte("PING\r\n"))
		if err == nil {
			_, err = c.Read(make([]byte, 16))
		}
		c.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
	// Plaintext gets no PONG.
	pc, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err == nil {
		pc.SetDeadline(time.Now().Add(5 * time.Second))
		pc.Write([]byte("PING\r\n"))
		buf := make([]byte, 16)
		n, _ := pc.Read(buf)
		pc.Close()
		if string(buf[:n]) == "+PONG\r\n" {
			t.Fatal("the TLS port answered plaintext")
		}
	} else if !errors.Is(err, net.ErrClosed) {
		t.Logf("plaintext dial: %v", err)
	}
}

// TestSentinelTLS: a whole Sentinel group over TLS converges and reports
// its master.
func TestSentinelTLS(t *testing.T) {
	pki := certtest.New(t)
	g := redistest.SentinelTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
	addr, err := g.MasterAddr()
	if err != nil || addr != g.Primary.Addr {
		t.Fatalf("MasterAddr = %q, %v; want %s", addr, err, g.Primary.Addr)
	}
}

// TestClusterSecure: a cluster whose nodes speak TLS only (bus included)
// and require a password becomes healthy; a client without the password
// is refused, and a plaintext one gets no answer.
func TestClusterSecure(t *testing.T) {
	t.Parallel()
	pki := certtest.New(t)
	c := redistest.ClusterSecure(t, redistest.ClusterSecurity{
		TLS:      &redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, Client: pki.ClientConfig(false)},
		Password: "s3cret",
	})
	if v, err := c.Nodes[0].Do("CLUSTER", "INFO"); err != nil || !strings.Contains(v.(string), "cluster_state:ok") {
		t.Fatalf("CLUSTER INFO: %v %v", v, err)
	}
	// Over TLS without AUTH: NOAUTH.
	tc, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", c.Addrs[0], pki.ClientConfig(false))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	tc.Write([]byte("PING\r\n"))
	buf := make([]byte, 64)
	n, _ := tc.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "-NOAUTH") {
		t.Fatalf("PING without the password: %q", buf[:n])
	}
	// Plaintext gets no PONG.
	if pc, err := net.DialTimeout("tcp", c.Addrs[1], 5*time.Second); err == nil {
		pc.SetDeadline(time.Now().Add(5 * time.Second))
		pc.Write([]byte("PING\r\n"))
		n, _ := pc.Read(buf)
		pc.Close()
		if strings.Contains(string(buf[:n]), "PONG") {
			t.Fatal("a TLS cluster node answered plaintext")
		}
	}
	// The bus is TLS too: the cluster could not have formed otherwise,
	// but say so.
	if v, err := c.Nodes[2].Do("CONFIG", "GET", "tls-cluster"); err != nil || len(v.([]any)) != 2 || v.([]any)[1] != "yes" {
		t.Fatalf("tls-cluster: %v %v", v, err)
	}
}

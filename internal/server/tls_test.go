package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/redisstore"
)

// serveListeners serves s on HTTP and gRPC loopback listeners (TLS if s has a certificate).
func serveListeners(t *testing.T, s *Server) (httpAddr, grpcAddr string) {
	t.Helper()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, hl, gl) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return hl.Addr().String(), gl.Addr().String()
}

// tlsGet fetches url with a client of cfg on a fresh connection and
// returns the status and the serial number of the server's certificate.
func tlsGet(cfg *tls.Config, url string) (int, *big.Int, string, error) {
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber, resp.Proto, nil
}

// TestTLSListeners: with a certificate the HTTP API (HTTP/2 by ALPN) and
// gRPC speak TLS only; a rotated certificate is served from the next
// handshake on, without a restart; a half-written rotation keeps the old.
func TestTLSListeners(t *testing.T) {
	pki := certtest.New(t)
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(""),
		WithTLS(pki.Cert, pki.Key, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if on, mutual := s.TLS(); !on || mutual {
		t.Fatalf("TLS() = %v, %v; want on, not mutual", on, mutual)
	}
	ha, ga := serveListeners(t, s)
	base := "https://" + ha

	code, serial1, proto, err := tlsGet(pki.ClientConfig(false), base+"/healthz")
	if err != nil || code != 200 {
		t.Fatalf("GET /healthz over TLS: %d %v", code, err)
	}
	if proto != "HTTP/2.0" {
		t.Errorf("protocol %s; want HTTP/2.0 by ALPN", proto)
	}
	// Plaintext HTTP on the TLS port is refused.
	if resp, err := http.Get("http://" + ha + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plaintext HTTP was served on the TLS listener")
		}
	}
	// An untrusting client fails the handshake.
	if _, _, _, err := tlsGet(&tls.Config{RootCAs: certtest.New(t).Pool()}, base+"/healthz"); err == nil {
		t.Fatal("a client trusting another CA was served")
	}

	// gRPC over TLS.
	cc, err := grpc.NewClient(ga, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(false))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health over TLS: %v %v", r, err)
	}

	// Rotation: a new pair in the same files is served on new connections.
	serial2 := pki.Issue(pki.Cert, pki.Key, "weir test server 2", true)
	if serial2.Cmp(serial1) == 0 {
		t.Fatal("test bug: same serial")
	}
	_, got, _, err := tlsGet(pki.ClientConfig(false), base+"/healthz")
	if err != nil || got.Cmp(serial2) != 0 {
		t.Fatalf("after rotation: serial %v, %v; want %v", got, err, serial2)
	}
	// A half-written rotation (new key, old certificate) keeps the pair in
	// force until both files agree.
	other := certtest.New(t)
	other.Issue(pki.Dir+"/stray.pem", pki.Key, "stray", true) // only the key lands in pki's files
	_, got, _, err = tlsGet(pki.ClientConfig(false), base+"/healthz")
	if err != nil || got.Cmp(serial2) != 0 {
		t.Fatalf("mid-rotation: serial %v, %v; want the previous %v", got, err, serial2)
	}
	if s.tls.LastError() == nil {
		t.Error("a mismatched pair left no LastError")
	}
}

// TestMutualTLS: with a client CA, clients without a certificate are
// refused on HTTP and gRPC, and clients with one are served.
func TestMutualTLS(t *testing.T) {
	pki := certtest.New(t)
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(""),
		WithTLS(pki.Cert, pki.Key, pki.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ha, ga := serveListeners(t, s)
	base := "https://" + ha
	if _, _, _, err := tlsGet(pki.ClientConfig(false), base+"/healthz"); err == nil {
		t.Fatal("HTTP: a client without a certificate was served")
	}
	body := `{"rule":"api","key":"k1","hits":1}`
	tr := &http.Transport{TLSClientConfig: pki.ClientConfig(true), ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("HTTP with a client certificate: %v", err)
	}
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if resp.StatusCode != 200 || m["allowed"] != true {
		t.Fatalf("check over mutual TLS: %d %v", resp.StatusCode, m)
	}
	for _, withCert := range []bool{false, true} {
		cc, err := grpc.NewClient(ga, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(withCert))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		cc.Close()
		if withCert != (err == nil) {
			t.Errorf("gRPC with client certificate %v: err %v", withCert, err)
		}
	}

	// The client CA file is re-read too: once it holds another CA, that
	// CA's clients get in and the old CA's do not.
	other := certtest.New(t)
	ca, err := os.ReadFile(other.CA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pki.CA+".new", ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pki.CA+".new", pki.CA); err != nil {
		t.Fatal(err)
	}
	newClient := pki.ClientConfig(false) // trusts the server's CA
	newClient.Certificates = other.ClientConfig(true).Certificates
	if code, _, _, err := tlsGet(newClient, base+"/healthz"); err != nil || code != 200 {
		t.Errorf("a client of the new CA: %d %v", code, err)
	}
	if _, _, _, err := tlsGet(pki.ClientConfig(true), base+"/healthz"); err == nil {
		t.Error("a client of the replaced CA was still served")
	}
}

// TestTLSConfigErrors: bad TLS settings are refused with the file named.
func TestTLSConfigErrors(t *testing.T) {
	pki := certtest.New(t)
	for _, tc := range []struct {
		cert, key, ca, want string
	}{
		{pki.Cert, "", "", "certificate and its key"},
		{pki.Cert, pki.Dir + "/missing.pem", "", "missing.pem"},
		{pki.Cert, pki.Key, pki.Key, "no PEM certificate"},
		{pki.Cert, pki.ClientKey, "", "client-key.pem"},
	} {
		_, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(""),
			WithTLS(tc.cert, tc.key, tc.ca))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("WithTLS(%q, %q, %q): %v; want an error with %q", tc.cert, tc.key, tc.ca, err, tc.want)
		}
	}
	if _, err := policy.Parse([]byte("server:\n  tls:\n    cert: a.pem\n"), "t.yaml"); err == nil || !strings.Contains(err.Error(), "server.tls") {
		t.Errorf("server.tls without key: %v", err)
	}
}

// redisTLSConfig is testConfig on a Redis over TLS with the test PKI's
// CA and client certificate.
func redisTLSConfig(t *testing.T, pki *certtest.Files, store string) *config.Config {
	t.Helper()
	cfg := mustParse(t, testConfig)
	cfg.Store.Type = config.StoreRedis
	cfg.Store.Redis = config.RedisConfig{TLSCA: pki.CA, TLSCert: pki.ClientCert, TLSKey: pki.ClientKey}
	cfg.Store.Timeout = 10 * time.Second // a loaded machine must not hand Redis's decisions to the fallback
	switch store {
	case "standalone":
		r := redistest.StandaloneTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
		cfg.Store.Redis.Addrs = []string{r.Addr}
	case "sentinel":
		g := redistest.SentinelTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
		cfg.Store.Redis.Addrs, cfg.Store.Redis.MasterName = g.SentinelAddrs, g.MasterName
	}
	return cfg
}

// TestRedisTLS: the Redis store over TLS with a CA and a client
// certificate, standalone and under Sentinel: decisions are made in Redis
// (the sliding log of 3/m admits exactly 3), and no fallback decides.
func TestRedisTLS(t *testing.T) {
	for _, topo := range []string{"standalone", "sentinel"} {
		t.Run(topo, func(t *testing.T) {
			pki := certtest.New(t)
			cfg := redisTLSConfig(t, pki, topo)
			s, ts := newTestServer(t, WithConfig(cfg))
			eventually(t, 20*time.Second, "the store to connect over TLS", func() bool { return s.healthy.Load() && s.store.(*redisstore.Store).Connected() })
			admitted := 0
			for i := 0; i < 8; i++ {
				code, m := check(t, ts.URL, "login", "tls-client", 1)
				if code == 200 && m["allowed"] == true {
					admitted++
				}
				if m["fallback"] != nil {
					t.Fatalf("decision by fallback, not Redis: %v", m)
				}
			}
			if admitted != 3 {
				t.Fatalf("admitted %d of 8 under a limit of 3", admitted)
			}
			if topo != "standalone" {
				return
			}
			// Without the client certificate, or trusting another CA, the
			// store cannot connect: the settings are what made it work.
			for name, mod := range map[string]func(r *config.RedisConfig){
				"no client certificate": func(r *config.RedisConfig) { r.TLSCert, r.TLSKey = "", "" },
				"another CA":            func(r *config.RedisConfig) { r.TLSCA = certtest.New(t).CA },
			} {
				sc := cfg.Store
				mod(&sc.Redis)
				rc, err := redisConfig(sc)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				rs, err := redisstore.New(ctx, rc)
				cancel()
				if err == nil {
					rs.Close()
					t.Errorf("%s: the store connected", name)
				}
			}
		})
	}
}

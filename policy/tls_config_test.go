package policy

import (
	"strings"
	"testing"
)

// TestTLSSettings: server.tls and store.redis's TLS files parse, and a
// certificate without its key is refused at the line of the setting.
func TestTLSSettings(t *testing.T) {
	cfg, err := Parse([]byte(`server:
  tls: {cert: s.pem, key: s.key, client_ca: ca.pem}
store:
  redis:
    addrs: [127.0.0.1:6380]
    tls_ca: ca.pem
    tls_cert: c.pem
    tls_key: c.key
    tls_server_name: redis.internal
rules: []
`), "ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if tl := cfg.Server.TLS; tl.Cert != "s.pem" || tl.Key != "s.key" || tl.ClientCA != "ca.pem" {
		t.Errorf("server.tls: %+v", tl)
	}
	if r := cfg.Store.Redis; r.TLSCA != "ca.pem" || r.TLSCert != "c.pem" || r.TLSKey != "c.key" || r.TLSServerName != "redis.internal" || !r.TLSOn() || r.TLS {
		t.Errorf("store.redis: %+v", r)
	}
	_, err = Parse([]byte("server:\n  tls:\n    cert: a.pem\nstore:\n  redis:\n    addrs: [127.0.0.1:6380]\n    tls_cert: c.pem\nrules: []\n"), "bad.yaml")
	for _, want := range []string{"bad.yaml:3:5: server.tls needs cert and key", "bad.yaml:7:5: tls_cert and tls_key go together"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

package server

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/internal/tlsfiles"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/redisstore"
)

// TestWithStoreTimeout: the option replaces store.timeout as the deadline
// of every store call. While Redis is paused, a call under a deadline
// longer than the pause waits and is decided by Redis; the same call
// under the default deadline is decided by on_error (fallback).
func TestWithStoreTimeout(t *testing.T) {
	r := redistest.Standalone(t)
	cfgFor := func() *config.Config {
		cfg := mustParse(t, testConfig)
		cfg.Store.Type = config.StoreRedis
		cfg.Store.Redis = config.RedisConfig{Addrs: []string{r.Addr}}
		return cfg
	}
	long, tsLong := newTestServer(t, WithConfig(cfgFor()), WithStoreTimeout(30*time.Second))
	def, tsDef := newTestServer(t, WithConfig(cfgFor()))
	for _, s := range []*Server{long, def} {
		eventually(t, 20*time.Second, "the store to connect", func() bool { return s.healthy.Load() && s.redis.Connected() })
	}
	if got := long.redis.Timeout(); got != 30*time.Second {
		t.Fatalf("store timeout %v, want the option's 30s", got)
	}
	if got := def.redis.Timeout(); got != guard.DefaultTimeout {
		t.Fatalf("store timeout without the option %v, want %v", got, guard.DefaultTimeout)
	}
	// Warm both servers' connections, then pause Redis for longer than
	// the default deadline by far and much less than the option's.
	check(t, tsLong.URL, "login", "warm", 1)
	check(t, tsDef.URL, "login", "warm", 1)
	if _, err := r.Do("CLIENT", "PAUSE", "1500", "ALL"); err != nil {
		t.Fatal(err)
	}
	if _, m := check(t, tsDef.URL, "login", "paused", 1); m["fallback"] == nil {
		t.Errorf("default deadline, Redis paused: %v, want a decision by fallback", m)
	}
	if _, m := check(t, tsLong.URL, "login", "paused", 1); m["fallback"] != nil || m["allowed"] != true {
		t.Errorf("30s deadline, Redis paused: %v, want Redis's decision", m)
	}
}

// TestWithRedisTLS: the option's files connect to a Redis that requires
// client certificates, without any TLS setting in the config, and
// anyName lets a certificate for another name through only when it
// chains to the CA.
func TestWithRedisTLS(t *testing.T) {
	pki := certtest.New(t)
	// A server certificate for another name only: not 127.0.0.1.
	otherCert, otherKey := filepath.Join(pki.Dir, "other.pem"), filepath.Join(pki.Dir, "other-key.pem")
	pki.IssueNamedOnly(otherCert, otherKey, "redis.example", "redis.example")
	for _, c := range []struct {
		name          string
		cert, key     string
		ca            string
		clientCert    bool
		anyName, want bool
	}{
		{"client certificate", pki.Cert, pki.Key, pki.CA, true, false, true},
		{"no client certificate", pki.Cert, pki.Key, pki.CA, false, false, false},
		{"another name", otherCert, otherKey, pki.CA, true, false, false},
		{"another name, skip hostname verification", otherCert, otherKey, pki.CA, true, true, true},
		{"another CA, skip hostname verification", otherCert, otherKey, certtest.New(t).CA, true, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := redistest.StandaloneTLS(t, redistest.TLS{CA: pki.CA, Cert: c.cert, Key: c.key, AuthClients: true, Client: anyNameClient(pki)})
			cfg := mustParse(t, testConfig)
			cfg.Store.Type = config.StoreRedis
			cfg.Store.Redis = config.RedisConfig{Addrs: []string{r.Addr}}
			cert, key := "", ""
			if c.clientCert {
				cert, key = pki.ClientCert, pki.ClientKey
			}
			// A long deadline: a loaded machine must not make Redis's decisions fallbacks.
			s, ts := newTestServer(t, WithConfig(cfg), WithRedisTLS(c.ca, cert, key, c.anyName), WithStoreTimeout(10*time.Second))
			if !c.want {
				// The store starts lazily: it must never connect.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				rc, err := redisConfig(s.base.Load().Store)
				if err != nil {
					t.Fatal(err)
				}
				if c.anyName {
					rc.TLS = tlsfiles.AnyName(rc.TLS)
				}
				if rs, err := redisstore.New(ctx, rc); err == nil {
					rs.Close()
					t.Fatal("connected")
				}
				if _, m := check(t, ts.URL, "login", "tls", 1); m["fallback"] == nil {
					t.Fatalf("decided without fallback: %v", m)
				}
				return
			}
			eventually(t, 20*time.Second, "the store to connect over TLS", func() bool { return s.healthy.Load() && s.redis.Connected() })
			admitted := 0
			for range 6 {
				_, m := check(t, ts.URL, "login", "tls", 1)
				if m["fallback"] != nil {
					t.Fatalf("decision by fallback, not Redis: %v", m)
				}
				if m["allowed"] == true {
					admitted++
				}
			}
			if admitted != 3 {
				t.Fatalf("admitted %d of 6 under a limit of 3", admitted)
			}
		})
	}
}

// anyNameClient is the test helper's own client config: the client
// certificate, the CA, any server name.
func anyNameClient(pki *certtest.Files) *tls.Config { return tlsfiles.AnyName(pki.ClientConfig(true)) }

// TestWithRedisTLSWithoutRedis: Redis TLS files for a store that is not
// Redis are a mistake, named, not ignored.
func TestWithRedisTLSWithoutRedis(t *testing.T) {
	_, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithRedisTLS("/ca.pem", "", "", false))
	if err == nil || !strings.Contains(err.Error(), "--redis-tls") || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("err %v, want one naming --redis-tls-* and the memory store", err)
	}
}

package envoyxds_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/envoyxds"
	"github.com/weir-dev/weir/internal/envoyxds/xdstest"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/store/memstore"
)

const node = "envoy-ratelimit"

// subscribe runs a client against addr until the test ends; every config
// it applies arrives on the returned channel.
func subscribe(t *testing.T, addr string, tlsCfg *tls.Config, log *slog.Logger) <-chan *envoyrls.Config {
	t.Helper()
	ch := make(chan *envoyrls.Config, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := envoyxds.Run(ctx, envoyxds.Options{Server: addr, NodeID: node, TLS: tlsCfg,
			RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Log: log},
			func(c *envoyrls.Config) { ch <- c })
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ch
}

func next(t *testing.T, ch <-chan *envoyrls.Config) *envoyrls.Config {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(xdstest.Wait):
		t.Fatalf("no config applied within %v", xdstest.Wait)
		return nil
	}
}

// admitted counts how many of calls ShouldRateLimit calls for
// domain/key=value cfg admits, on a fresh store.
func admitted(t *testing.T, cfg *envoyrls.Config, domain, key, value string, calls int) int {
	t.Helper()
	svc := envoyrls.New(cfg, memstore.New())
	n := 0
	for range calls {
		resp, err := svc.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain,
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
			n++
		}
	}
	return n
}

func TestLoadUpdateRefuseRestart(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0", nil, node)
	srv.Set("1", xdstest.Limit("route-a", "gw", "path", "/a", 3, rlsconfv3.RateLimitUnit_MINUTE))
	cfgs := subscribe(t, srv.Addr, nil, nil)

	// Load.
	c := next(t, cfgs)
	srv.WaitRequest("ACK of version 1", xdstest.ACK("1"))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 3 {
		t.Fatalf("version 1 (3/minute) admitted %d of 10, want 3", got)
	}

	// Update: two resources, two domains.
	srv.Set("2", xdstest.Limit("route-a", "gw", "path", "/a", 5, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("route-b", "other", "path", "/b", 1, rlsconfv3.RateLimitUnit_HOUR))
	c = next(t, cfgs)
	srv.WaitRequest("ACK of version 2", xdstest.ACK("2"))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 5 {
		t.Fatalf("version 2 (5/minute) admitted %d of 10, want 5", got)
	}
	if got := admitted(t, c, "other", "path", "/b", 10); got != 1 {
		t.Fatalf("version 2 (1/hour) admitted %d of 10, want 1", got)
	}

	// A bad update: the same domain in two resources. Refused as a whole
	// with a message, NACKed naming the last good version.
	srv.Set("3", xdstest.Limit("route-a", "gw", "path", "/a", 7, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("route-c", "gw", "path", "/c", 1, rlsconfv3.RateLimitUnit_MINUTE))
	nack := srv.WaitRequest("NACK of version 3", xdstest.NACK(`domain "gw" is already defined`))
	if nack.GetVersionInfo() != "2" {
		t.Errorf("NACK names version %q, want the last accepted, 2", nack.GetVersionInfo())
	}
	// An unknown unit is refused too.
	srv.Set("4", xdstest.Limit("route-a", "gw", "path", "/a", 7, rlsconfv3.RateLimitUnit_UNKNOWN))
	nack = srv.WaitRequest("NACK of version 4", xdstest.NACK("unit"))
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, `"UNKNOWN"`) {
		t.Errorf("NACK message %q does not name the bad unit", msg)
	}

	// The next good one is the next applied: 3 and 4 never were.
	srv.Set("5", xdstest.Limit("route-a", "gw", "path", "/a", 2, rlsconfv3.RateLimitUnit_SECOND))
	c = next(t, cfgs)
	srv.WaitRequest("ACK of version 5", xdstest.ACK("5"))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 2 {
		t.Fatalf("version 5 (2/second) admitted %d of 10, want 2", got)
	}

	// The management server restarts, empty of the old state and with its
	// versions starting again at 1: the client reconnects and loads it.
	addr := srv.Addr
	srv.Stop()
	srv = xdstest.Start(t, addr, nil, node)
	srv.Set("1", xdstest.Limit("route-a", "gw", "path", "/a", 4, rlsconfv3.RateLimitUnit_MINUTE))
	c = next(t, cfgs)
	srv.WaitRequest("ACK of version 1 after the restart", xdstest.ACK("1"))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 4 {
		t.Fatalf("after the restart (4/minute) admitted %d of 10, want 4", got)
	}

	// An empty snapshot: no configs, nothing limited.
	srv.Set("2")
	c = next(t, cfgs)
	if d := c.Domains(); len(d) != 0 {
		t.Fatalf("empty snapshot: domains %v", d)
	}
}

// lockedBuffer is a log sink safe for the client's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestMutualTLS(t *testing.T) {
	pki := certtest.New(t)
	pair, err := tls.LoadX509KeyPair(pki.Cert, pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	// As Envoy Gateway's: a server certificate, client certificates required.
	srv := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair},
		ClientCAs: pki.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, node)
	srv.Set("1", xdstest.Limit("route-a", "gw", "path", "/a", 3, rlsconfv3.RateLimitUnit_MINUTE))

	// Without a client certificate the server refuses the client, which
	// says so and keeps trying.
	var logs lockedBuffer
	noCert := subscribe(t, srv.Addr, pki.ClientConfig(false), slog.New(slog.NewTextHandler(&logs, nil)))
	deadline := time.Now().Add(xdstest.Wait)
	for !strings.Contains(logs.String(), "stream to the management server broke") {
		if time.Now().After(deadline) {
			t.Fatalf("no failure logged for a client without a certificate; log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-noCert:
		t.Fatal("a client without a certificate got a config")
	default:
	}

	// With the client certificate it loads.
	c := next(t, subscribe(t, srv.Addr, pki.ClientConfig(true), nil))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 3 {
		t.Fatalf("over mutual TLS (3/minute) admitted %d of 10, want 3", got)
	}
}

// TestMergeDomains: with MergeDomains (--envoy-merge-domains, the peer's
// MERGE_DOMAIN_CONFIG) two resources of one domain load as one, each
// resource's descriptors in force; a descriptor both define is still
// refused.
func TestMergeDomains(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0", nil, node)
	srv.Set("1", xdstest.Limit("route-a", "gw", "path", "/a", 3, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("route-c", "gw", "path", "/c", 1, rlsconfv3.RateLimitUnit_MINUTE))
	ch := make(chan *envoyrls.Config, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = envoyxds.Run(ctx, envoyxds.Options{Server: srv.Addr, NodeID: node, MergeDomains: true,
			RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond},
			func(c *envoyrls.Config) { ch <- c })
	}()
	t.Cleanup(func() { cancel(); <-done })

	c := next(t, ch)
	srv.WaitRequest("ACK of version 1", xdstest.ACK("1"))
	if got := admitted(t, c, "gw", "path", "/a", 10); got != 3 {
		t.Fatalf("merged: /a (3/minute) admitted %d of 10, want 3", got)
	}
	if got := admitted(t, c, "gw", "path", "/c", 10); got != 1 {
		t.Fatalf("merged: /c (1/minute) admitted %d of 10, want 1", got)
	}

	srv.Set("2", xdstest.Limit("route-a", "gw", "path", "/a", 3, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("route-a2", "gw", "path", "/a", 9, rlsconfv3.RateLimitUnit_MINUTE))
	srv.WaitRequest("NACK of version 2", xdstest.NACK("duplicate descriptor"))
}

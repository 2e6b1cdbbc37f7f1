package redistest

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TLS configures servers that speak TLS only (no plaintext port).
type TLS struct {
	// CA, Cert and Key are PEM files: the CA that clients' certificates
	// must chain to, and the server's certificate and key (which a replica
	// and a sentinel also present as clients, so it must allow client
	// authentication).
	CA, Cert, Key string
	// AuthClients makes the servers require client certificates
	// (tls-auth-clients yes); without it they accept clients without one.
	AuthClients bool
	// Client is the config the helper's own connections use (PING, Do):
	// it must trust CA and, with AuthClients, present a certificate.
	Client *tls.Config
}

// args returns the redis-server arguments that turn port into a TLS port
// and close the plaintext one; the last occurrence of a setting wins.
func (c TLS) args(port int) []string {
	auth := "optional"
	if c.AuthClients {
		auth = "yes"
	}
	return []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", c.Cert,
		"--tls-key-file", c.Key,
		"--tls-ca-cert-file", c.CA,
		"--tls-auth-clients", auth,
		"--tls-replication", "yes",
	}
}

// conf is args as sentinel.conf lines.
func (c TLS) conf(port int) []string {
	a := c.args(port)
	var lines []string
	for i := 0; i+1 < len(a); i += 2 {
		lines = append(lines, strings.TrimPrefix(a[i], "--")+" "+a[i+1])
	}
	return lines
}

// StandaloneTLS starts a standalone redis-server that speaks only TLS, on a
// free loopback port, as Standalone does.
func StandaloneTLS(t testing.TB, c TLS) *Server {
	t.Helper()
	return newServerTLS(t, "redis (TLS)", false, func(port int, dir string) ([]string, error) {
		return append(baseArgs(port, dir), c.args(port)...), nil
	}, c.Client)
}

// SentinelTLS is Sentinel with every process speaking only TLS: the
// primary, the replica (replicating over TLS) and the three sentinels
// (which reach the data nodes and one another over TLS).
func SentinelTLS(t testing.TB, c TLS) *SentinelGroup {
	t.Helper()
	g := &SentinelGroup{MasterName: sentinelMasterName}
	g.Primary = newServerTLS(t, "sentinel primary (TLS)", false, func(port int, dir string) ([]string, error) {
		return append(baseArgs(port, dir), c.args(port)...), nil
	}, c.Client)
	_, primaryPort, _ := net.SplitHostPort(g.Primary.Addr)
	g.Replica = newServerTLS(t, "sentinel replica (TLS)", false, func(port int, dir string) ([]string, error) {
		return append(append(baseArgs(port, dir), c.args(port)...), "--replicaof", "127.0.0.1", primaryPort), nil
	}, c.Client)
	g.waitReplicaSynced(t, "TLS replica")
	for range 3 {
		s := newServerTLS(t, "sentinel (TLS)", false, func(port int, dir string) ([]string, error) {
			conf := filepath.Join(dir, "sentinel.conf")
			lines := append([]string{
				"bind 127.0.0.1",
				"daemonize no",
				"dir " + strconv.Quote(dir),
				"logfile " + strconv.Quote(filepath.Join(dir, "redis.log")),
			}, c.conf(port)...)
			lines = append(lines,
				"sentinel monitor "+g.MasterName+" 127.0.0.1 "+primaryPort+" 2",
				"sentinel down-after-milliseconds "+g.MasterName+" 1000",
				"sentinel failover-timeout "+g.MasterName+" 5000",
				"sentinel parallel-syncs "+g.MasterName+" 1",
			)
			if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
				return nil, err
			}
			return []string{conf, "--sentinel"}, nil
		}, c.Client)
		g.Sentinels = append(g.Sentinels, s)
		g.SentinelAddrs = append(g.SentinelAddrs, s.Addr)
	}
	waitForGroup(t, g.Sentinels, g.settled, "TLS sentinels did not converge")
	return g
}

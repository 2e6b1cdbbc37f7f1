package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy/config"
)

// nodeModules is where Debian's node-redis (package node-redis) installs
// the module; nodesource's node does not look there by itself.
const nodeModules = "/usr/share/nodejs"

// nodeRedisScript calls weir's commands with node-redis 4: sendCommand,
// node-redis' auto-pipelining of commands sent in one tick, and a
// reservation settled once. It prints one JSON document.
const nodeRedisScript = `
const { createClient } = require('redis');
(async () => {
  const [url, password] = process.argv.slice(2);
  const client = createClient({ url, password });
  client.on('error', (e) => { console.error(e); process.exit(2); });
  await client.connect();
  const out = {};
  out.version = require('redis/package.json').version;
  out.ping = await client.ping();
  out.throttle = await client.sendCommand(['CL.THROTTLE', 'node', '2', '1', '60']);
  out.gcra = await client.sendCommand(['GCRA', 'node2', '1', '1', '60', 'TOKENS', '2']);
  out.gcraLimited = await client.sendCommand(['GCRA', 'node2', '1', '1', '60']);
  out.check = (await client.sendCommand(['WEIR.CHECK', 'api', 'node'])).slice(0, 3);
  out.pipelined = (await Promise.all([1, 2, 3, 4].map(() =>
    client.sendCommand(['CL.THROTTLE', 'node3', '2', '1', '60'])))).map((r) => r[0]);
  const r = await client.sendCommand(['WEIR.RESERVE', 'api', 'node4', '2']);
  const id = r[r.indexOf('reservation') + 1];
  const s = await client.sendCommand(['WEIR.SETTLE', id, '1']);
  out.settled = s[s.indexOf('remaining') + 1];
  try { await client.sendCommand(['WEIR.SETTLE', id, '1']); out.twice = 'accepted'; }
  catch (e) { out.twice = e.message; }
  try { await client.sendCommand(['CL.THROTTLE', 'node', '-1', '1', '60']); out.bad = 'accepted'; }
  catch (e) { out.bad = e.message; }
  console.log(JSON.stringify(out));
  await client.quit();
})().catch((e) => { console.error(e); process.exit(1); });
`

// TestRESPNodeRedis drives the listener with Node's node-redis 4 (Debian's
// package; `make deps` installs it), on the memory store and on Redis.
func TestRESPNodeRedis(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (make deps installs nodejs)")
	}
	if _, err := os.Stat(filepath.Join(nodeModules, "redis", "package.json")); err != nil {
		t.Skip("node-redis is not installed (make deps installs Debian's node-redis)")
	}
	script := filepath.Join(t.TempDir(), "weir.js")
	if err := os.WriteFile(script, []byte(nodeRedisScript), 0o600); err != nil {
		t.Fatal(err)
	}
	stores(t, func(t *testing.T, url string) {
		const token = "node-token-0123456789abcdef"
		addr, _ := startRESP(t, withRedis(t, url, WithRESPToken(token))...)
		cmd := exec.Command("node", script, "redis://"+addr, token)
		cmd.Env = append(os.Environ(), "NODE_PATH="+nodeModules)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var got struct {
			Version, Ping, Twice, Bad   string
			Throttle, Gcra, GcraLimited []int64
			Check, Pipelined            []int64
			Settled                     int64
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("node's output: %v\n%s", err, out)
		}
		if !strings.HasPrefix(got.Version, "4.") || got.Ping != "PONG" {
			t.Errorf("node-redis %s, PING %q", got.Version, got.Ping)
		}
		for name, pair := range map[string][2]any{
			"CL.THROTTLE":           {got.Throttle, "[0 3 2 -1 60]"},
			"GCRA TOKENS 2":         {got.Gcra, "[0 2 0 -1 120]"},
			"GCRA when spent":       {got.GcraLimited, "[1 2 0 60 120]"},
			"WEIR.CHECK":            {got.Check, "[0 5 4]"},
			"pipelined CL.THROTTLE": {got.Pipelined, "[0 0 0 1]"},
			"WEIR.SETTLE 1 of 2":    {got.Settled, "4"},
		} {
			if fmt.Sprint(pair[0]) != pair[1] {
				t.Errorf("%s: %v, want %v", name, pair[0], pair[1])
			}
		}
		if !strings.Contains(got.Twice, "already settled") || !strings.Contains(got.Bad, "max_burst is out of range") {
			t.Errorf("refusals: settle twice %q, max_burst -1 %q", got.Twice, got.Bad)
		}
	})
}

// TestRESPSentinelCluster decides CL.THROTTLE and WEIR.RESERVE over RESP
// with the store on Redis Sentinel and on Redis Cluster, two instances
// sharing it: exactly the limit admitted under concurrency.
func TestRESPSentinelCluster(t *testing.T) {
	if !redistest.Available() {
		t.Skip("redis-server not installed")
	}
	for _, topo := range []string{"sentinel", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			cfg := mustParse(t, respReserveRules)
			cfg.Store.Type = config.StoreRedis
			switch topo {
			case "sentinel":
				g := redistest.Sentinel(t)
				cfg.Store.Redis.Addrs, cfg.Store.Redis.MasterName = g.SentinelAddrs, g.MasterName
			case "cluster":
				cfg.Store.Redis.Addrs = redistest.Cluster(t).Addrs
			}
			a, _ := startRESP(t, WithConfig(cfg))
			b, _ := startRESP(t, WithConfig(cfg), WithInstanceID("second"))
			exactUnderPipelines(t, []string{a, b}, 16, 10, 20)
			reserveExactly(t, []string{a, b}, "hot-"+topo, 100)
		})
	}
}

// TestRESPTLS serves RESP over TLS (server.tls's certificate) and mutual
// TLS (with a client CA), to redis-cli --tls and to rueidis: a client
// without a certificate, or over plain TCP, gets nothing decided.
func TestRESPTLS(t *testing.T) {
	pki := certtest.New(t)
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "mtls"}[mutual], func(t *testing.T) {
			ca := ""
			if mutual {
				ca = pki.CA
			}
			addr, _ := startRESP(t, WithTLS(pki.Cert, pki.Key, ca))
			host, port, _ := net.SplitHostPort(addr)

			cc := pki.ClientConfig(mutual)
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, TLSConfig: cc})
			if err != nil {
				t.Fatalf("rueidis over TLS: %v", err)
			}
			defer c.Close()
			got, err := c.Do(context.Background(), c.B().Arbitrary("CL.THROTTLE").Args("tls", "1", "1", "60").Build()).AsIntSlice()
			if err != nil || fmt.Sprint(got) != "[0 2 1 -1 60]" {
				t.Errorf("rueidis over TLS: %v %v", got, err)
			}
			if mutual {
				bare := &tls.Config{RootCAs: cc.RootCAs, ServerName: cc.ServerName}
				if c2, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, TLSConfig: bare}); err == nil {
					c2.Close()
					t.Error("a client without a certificate connected under mutual TLS")
				}
			}
			if out := rawReply(t, addr, "PING\r\n"); strings.Contains(out, "PONG") {
				t.Errorf("plain TCP was answered on the TLS listener: %q", out)
			}

			if _, err := exec.LookPath("redis-cli"); err != nil {
				t.Log("redis-cli not installed; skipping it")
				return
			}
			args := []string{"--tls", "--cacert", pki.CA, "-h", host, "-p", port}
			if mutual {
				args = append(args, "--cert", pki.ClientCert, "--key", pki.ClientKey)
			}
			out, err := exec.Command("redis-cli", append(args, "CL.THROTTLE", "tls", "1", "1", "60")...).CombinedOutput()
			if f := strings.Fields(string(out)); err != nil || strings.Join(f, " ") != "0 2 0 -1 120" {
				t.Errorf("redis-cli --tls: %q %v", out, err)
			}
			if mutual {
				out, _ := exec.Command("redis-cli", append(args[:6], "CL.THROTTLE", "tls", "1", "1", "60")...).CombinedOutput()
				if strings.Contains(string(out), "120") {
					t.Errorf("redis-cli without a client certificate was answered: %q", out)
				}
			}
		})
	}
}

// rawReply sends in on plain TCP and returns what comes back before the
// connection ends.
func rawReply(t *testing.T, addr, in string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte(in))
	buf := make([]byte, 256)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _ := c.Read(buf)
	return string(buf[:n])
}

// TestRESPDashboard checks that RESP decisions reach the dashboard's
// snapshot as the others do: CL.THROTTLE and GCRA under their command's
// name and WEIR.CHECK and WEIR.RESERVE under their rule's, in the
// per-second series and in the top limited identities.
func TestRESPDashboard(t *testing.T) {
	s, _ := newTestServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ServeRESP(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.shutdownRESP(context.Background()) })
	c := rueidisTo(t, l.Addr().String())
	do := func(args ...string) {
		t.Helper()
		if err := c.Do(context.Background(), c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	for range 3 { // 1 admitted, 2 limited
		do("CL.THROTTLE", "hot-throttle", "0", "1", "86400")
	}
	for range 2 { // 1 admitted, 1 limited
		do("GCRA", "hot-gcra", "0", "1", "86400")
	}
	do("CL.THROTTLE", "peek", "0", "1", "86400", "0") // a peek decides nothing
	for range 4 {
		do("WEIR.CHECK", "api", "hot-check")
	}
	for range 2 { // the api rule's 5/m: 1 admitted, 1 limited
		do("WEIR.RESERVE", "api", "hot-check", "1")
	}
	top := func(snap Snapshot, rule, id string) int64 {
		for _, e := range snap.Top[rule] {
			if e.Identity == id {
				return e.Count
			}
		}
		return 0
	}
	var snap Snapshot
	eventually(t, 30e9, "the second to complete", func() bool {
		snap = s.snapshot(newReq())
		return sum(snap.Series.Total.Allowed)+sum(snap.Series.Total.Limited) >= 11
	})
	for rule, want := range map[string][2]int64{"cl.throttle": {1, 2}, "gcra": {1, 1}, "api": {5, 1}} {
		sc := snap.Series.Rules[rule]
		if sc == nil {
			t.Errorf("no series for %s", rule)
			continue
		}
		if got := [2]int64{sum(sc.Allowed), sum(sc.Limited)}; got != want {
			t.Errorf("series of %s: allowed, limited %v; want %v", rule, got, want)
		}
	}
	if a, l := sum(snap.Series.Total.Allowed), sum(snap.Series.Total.Limited); a != 7 || l != 4 {
		t.Errorf("series total: allowed %d, limited %d; want 7, 4", a, l)
	}
	if top(snap, "cl.throttle", "hot-throttle") != 2 || top(snap, "gcra", "hot-gcra") != 1 || top(snap, "api", "hot-check") != 1 {
		t.Errorf("top limited identities: %v", snap.Top)
	}
}

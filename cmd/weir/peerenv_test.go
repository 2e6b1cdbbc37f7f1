package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/envoyxds/xdstest"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/redisstore"
)

func envLookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func egEnv() map[string]string {
	m := map[string]string{}
	for _, kv := range xdstest.EnvoyGatewayEnv {
		m[kv[0]] = kv[1]
	}
	return m
}

func hasServeFlag(name string) bool {
	fs, _ := newServeFlagSet(io.Discard)
	return fs.Lookup(name) != nil
}

func TestAsPeerUnderTheRatelimitName(t *testing.T) {
	got := asPeer([]string{"/bin/ratelimit"}, io.Discard)
	if strings.Join(got, " ") != "serve --envoy-compat" {
		t.Fatalf("as /bin/ratelimit: %q", got)
	}
	// The peer reads no arguments; deployments made for it pass some
	// (Envoy AI Gateway's: --quotaRateLimitServiceAddr=...). weir keeps
	// its own flags and drops the rest, naming each.
	var notes strings.Builder
	got = asPeer([]string{"/bin/ratelimit", "--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system",
		"--log-level", "debug", "-unknown", "v", "--envoy-compat", "stray", "--http=127.0.0.1:1"}, &notes)
	if want := "serve --envoy-compat --log-level debug --envoy-compat --http=127.0.0.1:1"; strings.Join(got, " ") != want {
		t.Fatalf("as /bin/ratelimit with arguments: %q, want %q", got, want)
	}
	for _, a := range []string{"--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system", `"-unknown"`, `"v"`, `"stray"`} {
		if !strings.Contains(notes.String(), strings.Trim(a, `"`)) {
			t.Errorf("the ignored argument %s is not named:\n%s", a, notes.String())
		}
	}
	if strings.Contains(notes.String(), "log-level") {
		t.Errorf("a weir flag was named as ignored:\n%s", notes.String())
	}
	if got := asPeer([]string{"/weir", "check", "x"}, io.Discard); strings.Join(got, " ") != "check x" {
		t.Fatalf("as /weir: %q", got)
	}
	if !peerRole([]string{"--envoy-compat"}, envLookup(nil)) || !peerRole(nil, envLookup(map[string]string{"WEIR_ENVOY_COMPAT": "true"})) ||
		peerRole([]string{"--", "--envoy-compat"}, envLookup(nil)) || peerRole(nil, envLookup(nil)) {
		t.Fatal("peerRole")
	}
}

// TestPeerEnvEnvoyGateway translates exactly the environment of Envoy
// Gateway's Deployment.
func TestPeerEnvEnvoyGateway(t *testing.T) {
	args, notes, err := translatePeerEnv(envLookup(egEnv()), hasServeFlag)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--http=0.0.0.0:8080", "--grpc=0.0.0.0:8081",
		"--tls-cert=/certs/tls.crt", "--tls-key=/certs/tls.key", "--tls-grpc-only=true",
		"--log-level=info", "--log-format=text",
		"--envoy-xds=envoy-gateway:18001", "--envoy-xds-node=envoy-ratelimit",
		"--envoy-xds-tls=true", "--envoy-xds-cert=/certs/tls.crt", "--envoy-xds-key=/certs/tls.key", "--envoy-xds-ca=/certs/ca.crt",
		"--envoy-xds-retry-min=10s", "--envoy-xds-retry-max=1m0s",
		"--metrics-addr=:19001", "--metrics-path=/metrics",
		"--redis=redis://redis.redis.svc:6379",
	}
	have := map[string]bool{}
	for _, a := range args {
		have[a] = true
	}
	for _, w := range want {
		if !have[w] && !(w == "--envoy-xds-retry-max=1m0s" && have["--envoy-xds-retry-max=60s"]) {
			t.Errorf("no %s in %q", w, args)
		}
	}
	if have["--envoy-await-config=true"] {
		t.Error("FORCE_START_WITHOUT_INITIAL_CONFIG=true yet --envoy-await-config")
	}
	for _, a := range args {
		if strings.HasPrefix(a, "--tls-client-ca") {
			t.Errorf("%s: the peer reads no GRPC_SERVER_TLS_CA_CERT, so it requires no client certificate", a)
		}
	}
	joined := strings.Join(notes, "\n")
	for _, n := range []string{"GRPC_SERVER_TLS_CA_CERT", "PROMETHEUS_MAPPER_YAML", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"} {
		if !strings.Contains(joined, n+":") {
			t.Errorf("no start-up notice for %s in:\n%s", n, joined)
		}
	}
	// And weir serve takes them all.
	env := egEnv()
	_, _, code := parseServeArgs([]string{"--envoy-compat"}, io.Discard, io.Discard, envLookup(env))
	if code != 0 {
		var b strings.Builder
		parseServeArgs([]string{"--envoy-compat"}, &b, &b, envLookup(env))
		t.Fatalf("parseServeArgs: exit %d: %s", code, b.String())
	}
}

func TestPeerEnvRedis(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"REDIS_URL=r:6379", "--redis=redis://r:6379"},
		{"REDIS_URL=r:6379 REDIS_AUTH=s3cr@t", "--redis=redis://:s3cr%40t@r:6379"},
		{"REDIS_URL=r:6379 REDIS_AUTH=bob:pw REDIS_TLS=true", "--redis=rediss://bob:pw@r:6379"},
		{"REDIS_URL=mymaster,s1:26379,s2:26379 REDIS_TYPE=SENTINEL", "--redis=redis+sentinel://s1:26379,s2:26379/mymaster"},
		{"REDIS_URL=n1:7000,n2:7000 REDIS_TYPE=cluster", "--redis=n1:7000,n2:7000"},
		{"REDIS_URL=n1:7000,n2:7000 REDIS_TYPE=CLUSTER REDIS_AUTH=s3cr@t", "--redis=redis://:s3cr%40t@n1:7000,n2:7000"},
		{"REDIS_URL=n1:7000,n2:7000,n3:7000 REDIS_TYPE=CLUSTER REDIS_TLS=true", "--redis=rediss://n1:7000,n2:7000,n3:7000"},
		{"REDIS_URL=n1:7000 REDIS_TYPE=CLUSTER REDIS_AUTH=bob:pw REDIS_TLS=true", "--redis=rediss://bob:pw@n1:7000"},
	} {
		env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "USE_STATSD": "false"}
		for _, kv := range strings.Fields(c.env) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		args, _, err := translatePeerEnv(envLookup(env), hasServeFlag)
		if err != nil {
			t.Errorf("%s: %v", c.env, err)
			continue
		}
		found := false
		for _, a := range args {
			found = found || a == c.want
		}
		if !found {
			t.Errorf("%s: want %s in %q", c.env, c.want, args)
		}
		// And weir's URL parser reads it back: the password unescaped.
		rc, err := redisstore.ParseURL(strings.TrimPrefix(c.want, "--redis="))
		if err != nil {
			t.Errorf("%s: %v", c.want, err)
		} else if strings.Contains(c.env, "REDIS_AUTH=s3cr@t") && rc.Password != "s3cr@t" {
			t.Errorf("%s: password %q", c.want, rc.Password)
		}
	}
}

// TestPeerEnvRefuses: a variable that would change decisions and that
// weir cannot honour stops it, named.
func TestPeerEnvRefuses(t *testing.T) {
	base := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "USE_STATSD": "false"}
	cases := map[string]string{
		"USE_STATSD=true":                              "USE_STATSD",
		"REDIS_SOCKET_TYPE=unix":                       "REDIS_SOCKET_TYPE",
		"REDIS_URL=/var/run/redis.sock":                "REDIS_URL",
		"REDIS_TYPE=RING":                              "REDIS_TYPE",
		"BACKEND_TYPE=memcache":                        "BACKEND_TYPE",
		"CONFIG_TYPE=GRPC_XDS_DELTA":                   "CONFIG_TYPE",
		"GRPC_CLIENT_TLS_SAN=envoy":                    "GRPC_CLIENT_TLS_SAN",
		"GRPC_UDS=/run/rl.sock":                        "GRPC_UDS",
		"CACHE_KEY_PREFIX=rl_":                         "CACHE_KEY_PREFIX",
		"REDIS_TIMEOUT=10":                             "REDIS_TIMEOUT",
		"REDIS_TIMEOUT=-1s":                            "REDIS_TIMEOUT",
		"REDIS_SENTINEL_AUTH=pw":                       "REDIS_SENTINEL_AUTH",
		"LOG_LEVEL=loud":                               "LOG_LEVEL",
		"GRPC_SERVER_USE_TLS=yes":                      "GRPC_SERVER_USE_TLS",
		"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true": "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
		"LIMIT_REMAINING_HEADER=X-Left":                "LIMIT_REMAINING_HEADER",
	}
	// The flags other parts of weir add: refused while this weir lacks them.
	for v, flag := range map[string]string{"SHADOW_MODE": "envoy-shadow-mode", "QUOTA_MODE": "envoy-quota-mode",
		"RESPONSE_DYNAMIC_METADATA": "envoy-dynamic-metadata", "MERGE_DOMAIN_CONFIG": "envoy-merge-domains",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "envoy-response-headers"} {
		if hasServeFlag(flag) {
			env := map[string]string{v: "true"}
			for k, x := range base {
				env[k] = x
			}
			args, _, err := translatePeerEnv(envLookup(env), hasServeFlag)
			if err != nil || !strings.Contains(strings.Join(args, " "), "--"+flag+"=true") {
				t.Errorf("%s=true: %v %q, want --%s=true", v, err, args, flag)
			}
			continue
		}
		cases[v+"=true"] = v
	}
	for set, name := range cases {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		k, v, _ := strings.Cut(set, "=")
		env[k] = v
		_, _, err := translatePeerEnv(envLookup(env), hasServeFlag)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err %v, want one naming %s", set, err, name)
		}
	}
	// false (the default) is no change: accepted.
	env := map[string]string{"SHADOW_MODE": "false", "USE_DOG_STATSD": "false"}
	for k, v := range base {
		env[k] = v
	}
	if _, _, err := translatePeerEnv(envLookup(env), hasServeFlag); err != nil {
		t.Errorf("defaults spelled out: %v", err)
	}
	// Unset Redis: the peer's default is a Unix socket.
	if _, _, err := translatePeerEnv(envLookup(map[string]string{"USE_STATSD": "false"}), hasServeFlag); err == nil || !strings.Contains(err.Error(), "REDIS_URL") {
		t.Errorf("no Redis: %v", err)
	}
}

func TestPeerEnvRuntimeDirectory(t *testing.T) {
	env := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "USE_STATSD": "false",
		"RUNTIME_ROOT": "/srv/runtime_data/current", "RUNTIME_SUBDIRECTORY": "ratelimit"}
	args, _, err := translatePeerEnv(envLookup(env), hasServeFlag)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(args, " "), "--envoy-config=/srv/runtime_data/current/ratelimit/config") {
		t.Fatalf("%q", args)
	}
}

// TestPeerEnvDocumented: docs/envoy.md's table names every variable.
func TestPeerEnvDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range peerVars {
		if !strings.Contains(string(doc), "`"+p.name+"`") {
			t.Errorf("docs/envoy.md does not document %s", p.name)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// TestServeAsEnvoyGatewayRatelimit runs weir serve as /bin/ratelimit with
// Envoy Gateway's environment (addresses and certificate paths replaced
// for a test), a real Redis and a real xDS management server over mutual
// TLS: it is healthy, loads the config over xDS and decides exactly.
func TestServeAsEnvoyGatewayRatelimit(t *testing.T) {
	rds := redistest.Standalone(t)
	pki := certtest.New(t)
	pair, err := tls.LoadX509KeyPair(pki.Cert, pki.Key)
	if err != nil {
		t.Fatal(err)
	}
	for _, force := range []bool{true, false} {
		t.Run("FORCE_START_WITHOUT_INITIAL_CONFIG="+strconv.FormatBool(force), func(t *testing.T) {
			// As Envoy Gateway's: client certificates required. No
			// snapshot yet.
			xds := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pki.Pool(),
				ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, "envoy-ratelimit")
			env := egEnv()
			httpAddr, grpcAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
			for k, v := range map[string]string{
				"HOST": "127.0.0.1", "PORT": portOf(httpAddr), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": portOf(grpcAddr),
				"PROMETHEUS_ADDR":            metricsAddr,
				"CONFIG_GRPC_XDS_SERVER_URL": "localhost:" + portOf(xds.Addr),
				"GRPC_SERVER_TLS_CERT":       pki.Cert, "GRPC_SERVER_TLS_KEY": pki.Key, "GRPC_SERVER_TLS_CA_CERT": pki.CA,
				"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": pki.Cert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": pki.Key,
				"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":   pki.CA,
				"REDIS_URL":                           rds.Addr,
				"REDIS_TIMEOUT":                       "10s", // a loaded machine must not hand decisions to on_error
				"FORCE_START_WITHOUT_INITIAL_CONFIG":  strconv.FormatBool(force),
				"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "200ms",
			} {
				env[k] = v
			}
			domain := "gw-" + strconv.FormatBool(force)
			base, _, _ := startServe(t, env, asPeer([]string{"/bin/ratelimit"}, io.Discard)[1:]...)
			if base != "http://"+httpAddr {
				t.Fatalf("HTTP on %s, want plaintext on %s", base, httpAddr)
			}
			// Before any config: healthy only when forced.
			want, wantBody := 200, "OK"
			if !force {
				want, wantBody = 500, ""
			}
			if code, body := getHealth(t, base); code != want || body != wantBody {
				t.Fatalf("/healthcheck before the first config: %d %q, want %d %q", code, body, want, wantBody)
			}
			xds.Set("1", xdstest.Limit("route-a", domain, "path", "/a", 3, rlsconfv3.RateLimitUnit_HOUR))
			xds.WaitRequest("ACK of version 1", xdstest.ACK("1"))
			if code, body := getHealth(t, base); code != 200 || body != "OK" {
				t.Fatalf("/healthcheck with a config: %d %q", code, body)
			}

			// Envoy's call, over TLS without a client certificate (the
			// peer requires none under this environment).
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(false))))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cl := rlspb.NewRateLimitServiceClient(conn)
			var mu sync.Mutex
			ok := 0
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain,
						Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: "/a"}}}}})
					if err != nil {
						t.Error(err)
						return
					}
					if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
						mu.Lock()
						ok++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if ok != 3 {
				t.Fatalf("3/hour over xDS admitted %d of 20 concurrent calls", ok)
			}
			resp, err := http.Get("http://" + metricsAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), "weir_") {
				t.Fatalf("PROMETHEUS_ADDR /metrics: %d %.200s", resp.StatusCode, body)
			}
		})
	}
}

func getHealth(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeAsAIGatewayRatelimit runs weir serve as the rate limit service
// of Envoy AI Gateway's QuotaPolicy: /bin/ratelimit with the environment
// and the argument of AI Gateway's own Deployment, its config over xDS
// (node envoy-ai-gateway-ratelimit) in the shape AI Gateway's translator
// gives it (domain ai-gateway-quota, backend → model → buckets, every
// bucket in quota mode), and a real Redis. The call is over its limit
// only when every quota bucket it names is.
func TestServeAsAIGatewayRatelimit(t *testing.T) {
	rds := redistest.Standalone(t)
	xds := xdstest.Start(t, "127.0.0.1:0", nil, "envoy-ai-gateway-ratelimit")
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
	env := map[string]string{
		"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr,
		"RUNTIME_ROOT": t.TempDir(), "RUNTIME_SUBDIRECTORY": "ratelimit", "USE_STATSD": "false",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ai-gateway-ratelimit",
		"CONFIG_GRPC_XDS_SERVER_URL": xds.Addr, "GRPC_PORT": portOf(grpcAddr), "GRPC_HOST": "127.0.0.1",
		"HOST": "127.0.0.1", "PORT": portOf(httpAddr),
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "50ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "200ms",
		"REDIS_TIMEOUT": "10s", // the peer's default; a loaded machine must not hand decisions to on_error
	}
	args := asPeer([]string{"/bin/ratelimit", "--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system"}, io.Discard)
	base, _, _ := startServe(t, env, args[1:]...)

	hour := func(n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{RequestsPerUnit: n, Unit: rlsconfv3.RateLimitUnit_HOUR}
	}
	xds.Set("1", &rlsconfv3.RateLimitConfig{Name: "ai-gateway-quota", Domain: "ai-gateway-quota",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "backend_name", Value: "default/openai",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "model_name_override", Value: "gpt-4o",
				Descriptors: []*rlsconfv3.RateLimitDescriptor{
					{Key: "rule-0-x-tenant-id-match-0", RateLimit: hour(5), QuotaMode: true}, // per tenant (Distinct)
					{Key: "rule-1-match--1", Value: "rule-1-match--1", RateLimit: hour(3), QuotaMode: true},
				}}}}}})
	xds.WaitRequest("ACK of version 1", xdstest.ACK("1"))
	if code, body := getHealth(t, base); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck with a config: %d %q", code, body)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := rlspb.NewRateLimitServiceClient(conn)
	// As AI Gateway's route actions send it: the backend and model, then
	// one bucket per descriptor.
	desc := func(k, v string) *rlcommon.RateLimitDescriptor {
		return &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{
			{Key: "backend_name", Value: "default/openai"}, {Key: "model_name_override", Value: "gpt-4o"}, {Key: k, Value: v}}}
	}
	for i := 1; i <= 8; i++ {
		resp, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "ai-gateway-quota",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("rule-0-x-tenant-id-match-0", "tenant-a"), desc("rule-1-match--1", "rule-1-match--1")}})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()
		if len(st) != 2 {
			t.Fatalf("call %d: %d statuses, want 2", i, len(st))
		}
		tenantOver, defaultOver := st[0].GetCode() == rlspb.RateLimitResponse_OVER_LIMIT, st[1].GetCode() == rlspb.RateLimitResponse_OVER_LIMIT
		if tenantOver != (i > 5) || defaultOver != (i > 3) {
			t.Fatalf("call %d: tenant bucket over %v (5/hour), default bucket over %v (3/hour)", i, tenantOver, defaultOver)
		}
		if over := resp.GetOverallCode() == rlspb.RateLimitResponse_OVER_LIMIT; over != (i > 5) {
			t.Fatalf("call %d: overall over limit %v; in quota mode a call is over only when every bucket is", i, over)
		}
	}
}

// TestPeerEnvRedisTimeoutAndTLS: REDIS_TIMEOUT is the store's deadline,
// the peer's 10s when unset unless weir's own setting is given; the REDIS_TLS_* files are weir's Redis TLS settings, read, as
// the peer reads them, only with REDIS_TLS=true.
func TestPeerEnvRedisTimeoutAndTLS(t *testing.T) {
	base := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "USE_STATSD": "false"}
	for _, c := range []struct {
		env       string
		want, not []string
		note      string
	}{
		{"REDIS_TIMEOUT=250ms", []string{"--store-timeout=250ms"}, nil, ""},
		{"REDIS_TIMEOUT=10s", []string{"--store-timeout=10s"}, nil, ""},
		// Unset, the peer's default, unless weir's own setting is given.
		{"", []string{"--store-timeout=10s"}, nil, ""},
		{"WEIR_STORE_TIMEOUT=2s", nil, []string{"--store-timeout"}, ""},
		{"WEIR_CONFIG=/weir.yaml", nil, []string{"--store-timeout"}, ""},
		{"REDIS_TIMEOUT=0", []string{"--store-timeout=10s"}, nil, "REDIS_TIMEOUT"},
		{"REDIS_TLS=true REDIS_TLS_CACERT=/ca.pem REDIS_TLS_CLIENT_CERT=/c.pem REDIS_TLS_CLIENT_KEY=/k.pem",
			[]string{"--redis=rediss://r:6379", "--redis-tls-ca=/ca.pem", "--redis-tls-cert=/c.pem", "--redis-tls-key=/k.pem"},
			[]string{"--redis-tls-skip-hostname-verification"}, ""},
		{"REDIS_TLS=true REDIS_TLS_CACERT=/ca.pem REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true",
			[]string{"--redis-tls-ca=/ca.pem", "--redis-tls-skip-hostname-verification=true"}, []string{"--redis-tls-cert"}, ""},
		{"REDIS_TLS_CACERT=/ca.pem REDIS_TLS_CLIENT_CERT=/c.pem REDIS_TLS_CLIENT_KEY=/k.pem",
			[]string{"--redis=redis://r:6379"}, []string{"--redis-tls-"}, "REDIS_TLS_CLIENT_CERT"},
	} {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for _, kv := range strings.Fields(c.env) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		args, notes, err := translatePeerEnv(envLookup(env), hasServeFlag)
		if err != nil {
			t.Errorf("%s: %v", c.env, err)
			continue
		}
		joined := strings.Join(args, " ")
		for _, w := range c.want {
			if !strings.Contains(joined, w) {
				t.Errorf("%s: no %s in %q", c.env, w, args)
			}
		}
		for _, n := range c.not {
			if strings.Contains(joined, n) {
				t.Errorf("%s: %s in %q", c.env, n, args)
			}
		}
		if c.note != "" && !strings.Contains(strings.Join(notes, "\n"), c.note+":") {
			t.Errorf("%s: no notice of %s in %q", c.env, c.note, notes)
		}
		// weir serve takes the flags.
		fs, f := newServeFlagSet(io.Discard)
		if err := fs.Parse(args); err != nil {
			t.Errorf("%s: %v", c.env, err)
		} else if strings.Contains(c.env, "REDIS_TIMEOUT=250ms") && f.storeTimeout != 250*time.Millisecond {
			t.Errorf("%s: store timeout %v", c.env, f.storeTimeout)
		} else if c.env == "" && f.storeTimeout != 10*time.Second {
			t.Errorf("REDIS_TIMEOUT unset: store timeout %v, want the peer's 10s", f.storeTimeout)
		}
	}
	// A certificate without its key is refused, named.
	env := map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/c.pem"}
	for k, v := range base {
		env[k] = v
	}
	if _, _, err := translatePeerEnv(envLookup(env), hasServeFlag); err == nil || !strings.Contains(err.Error(), "REDIS_TLS_CLIENT_KEY") {
		t.Errorf("certificate without key: %v", err)
	}
}

// TestServeAsPeerRedisClientCertificate runs weir serve as
// envoyproxy/ratelimit with the peer's REDIS_TLS_* variables against a
// real redis-server that speaks TLS only and requires client
// certificates: weir connects with them and Redis decides, exactly.
// Without REDIS_TLS_CLIENT_CERT it cannot connect.
func TestServeAsPeerRedisClientCertificate(t *testing.T) {
	pki := certtest.New(t)
	rds := redistest.StandaloneTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "rl.yaml"), []byte("domain: tls\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, withCert := range []bool{false, true} {
		t.Run("client certificate "+strconv.FormatBool(withCert), func(t *testing.T) {
			httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
			env := map[string]string{
				"HOST": "127.0.0.1", "PORT": portOf(httpAddr), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": portOf(grpcAddr),
				"USE_STATSD": "false", "LOG_LEVEL": "info", "RUNTIME_ROOT": root,
				"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rds.Addr, "REDIS_TLS": "true", "REDIS_TLS_CACERT": pki.CA,
				// Long enough that a loaded machine never makes it on_error's.
				"REDIS_TIMEOUT": "10s",
			}
			if withCert {
				env["REDIS_TLS_CLIENT_CERT"], env["REDIS_TLS_CLIENT_KEY"] = pki.ClientCert, pki.ClientKey
			}
			base, _, _ := startServe(t, env, "--envoy-compat")
			if !withCert {
				resp, err := http.Get(base + "/healthz/store")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					t.Fatal("/healthz/store is 200 without the client certificate Redis requires")
				}
			}
			deadline := time.Now().Add(20 * time.Second)
			for withCert {
				resp, err := http.Get(base + "/healthz/store")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/healthz/store %d after 20s: no connection to Redis over TLS", resp.StatusCode)
				}
				time.Sleep(50 * time.Millisecond)
			}
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cl := rlspb.NewRateLimitServiceClient(conn)
			ok := 0
			for range 8 {
				resp, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "tls",
					Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: "/a"}}}}})
				if err != nil {
					t.Fatal(err)
				}
				if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
					ok++
				}
			}
			keys, err := rds.Do("DBSIZE")
			if err != nil {
				t.Fatal(err)
			}
			n, _ := keys.(int64)
			if !withCert {
				// on_error decided: nothing reached Redis.
				if n != 0 {
					t.Fatalf("DBSIZE %d without a client certificate", n)
				}
				return
			}
			if ok != 3 {
				t.Fatalf("3/hour admitted %d of 8", ok)
			}
			if n == 0 {
				t.Fatal("DBSIZE 0: nothing counted in Redis")
			}
		})
	}
}

// TestServeAsPeerSentinelTLS: REDIS_TYPE=SENTINEL with REDIS_TLS=true and
// the REDIS_TLS_* files reaches a Sentinel-managed Redis whose every
// process speaks TLS only and requires client certificates; Redis
// decides, exactly. Without a CA or client certificate weir refuses,
// naming the variable (it has no TLS to Sentinel without them).
func TestServeAsPeerSentinelTLS(t *testing.T) {
	pki := certtest.New(t)
	g := redistest.SentinelTLS(t, redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, AuthClients: true, Client: pki.ClientConfig(true)})
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "rl.yaml"), []byte("domain: s\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
	env := map[string]string{
		"HOST": "127.0.0.1", "PORT": portOf(httpAddr), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": portOf(grpcAddr),
		"USE_STATSD": "false", "RUNTIME_ROOT": root, "REDIS_TIMEOUT": "10s",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": g.MasterName + "," + strings.Join(g.SentinelAddrs, ","),
		"REDIS_TLS": "true",
	}
	if _, _, err := translatePeerEnv(envLookup(env), hasServeFlag); err == nil || !strings.Contains(err.Error(), "REDIS_TLS_CACERT") {
		t.Fatalf("Sentinel over TLS without files: %v, want a refusal naming REDIS_TLS_CACERT", err)
	}
	env["REDIS_TLS_CACERT"], env["REDIS_TLS_CLIENT_CERT"], env["REDIS_TLS_CLIENT_KEY"] = pki.CA, pki.ClientCert, pki.ClientKey
	base, _, _ := startServe(t, env, "--envoy-compat")
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz/store")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz/store %d after 30s: no connection to Sentinel's Redis over TLS", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := rlspb.NewRateLimitServiceClient(conn)
	ok := 0
	for range 8 {
		resp, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "s",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: "/a"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 3 {
		t.Fatalf("3/hour admitted %d of 8", ok)
	}
	if n, err := g.Primary.Do("DBSIZE"); err != nil || n.(int64) == 0 {
		t.Fatalf("primary DBSIZE %v %v: nothing counted in Sentinel's Redis", n, err)
	}
}

// TestServeAsPeerClusterSecure: REDIS_TYPE=CLUSTER with REDIS_AUTH, and
// with REDIS_TLS and REDIS_TLS_CACERT too, reaches a Redis Cluster whose
// nodes require the password (and speak TLS only, the cluster bus
// included); 30 concurrent calls on each of 3 descriptors are decided in
// the cluster, exactly 3 per descriptor.
func TestServeAsPeerClusterSecure(t *testing.T) {
	pki := certtest.New(t)
	for _, withTLS := range []bool{false, true} {
		t.Run("tls="+strconv.FormatBool(withTLS), func(t *testing.T) {
			sec := redistest.ClusterSecurity{Password: "p@ss word"}
			if withTLS {
				sec.TLS = &redistest.TLS{CA: pki.CA, Cert: pki.Cert, Key: pki.Key, Client: pki.ClientConfig(false)}
			}
			c := redistest.ClusterSecure(t, sec)
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "config", "rl.yaml"), []byte("domain: c\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
			env := map[string]string{
				"HOST": "127.0.0.1", "PORT": portOf(httpAddr), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": portOf(grpcAddr),
				"USE_STATSD": "false", "RUNTIME_ROOT": root,
				"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "CLUSTER", "REDIS_URL": strings.Join(c.Addrs, ","),
				"REDIS_AUTH": sec.Password,
			}
			if withTLS {
				env["REDIS_TLS"], env["REDIS_TLS_CACERT"] = "true", pki.CA
			}
			base, _, _ := startServe(t, env, "--envoy-compat")
			deadline := time.Now().Add(30 * time.Second)
			for {
				resp, err := http.Get(base + "/healthz/store")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("/healthz/store %d after 30s: no connection to the cluster", resp.StatusCode)
				}
				time.Sleep(50 * time.Millisecond)
			}
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cl := rlspb.NewRateLimitServiceClient(conn)
			var mu sync.Mutex
			admitted := map[string]int{}
			var wg sync.WaitGroup
			for i := range 90 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					path := "/p" + strconv.Itoa(i%3)
					resp, err := cl.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "c",
						Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: path}}}}})
					if err != nil {
						t.Error(err)
						return
					}
					if resp.GetOverallCode() == rlspb.RateLimitResponse_OK {
						mu.Lock()
						admitted[path]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			for _, p := range []string{"/p0", "/p1", "/p2"} {
				if admitted[p] != 3 {
					t.Errorf("3/hour on %s admitted %d of 30 concurrent calls", p, admitted[p])
				}
			}
			var keys int64
			for _, n := range c.Nodes {
				v, err := n.Do("DBSIZE")
				if err != nil {
					t.Fatal(err)
				}
				keys += v.(int64)
			}
			if keys == 0 {
				t.Fatal("nothing counted in the cluster")
			}
		})
	}
}

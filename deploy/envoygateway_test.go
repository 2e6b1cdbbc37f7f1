//go:build fleet

package deploy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/envoyxds/xdstest"
)

// TestEnvoyGatewayDeployment runs weir's image as Envoy Gateway's
// generated rate limit Deployment runs envoyproxy/ratelimit's: command
// /bin/ratelimit, no args, its environment (xdstest.EnvoyGatewayEnv, from
// EG's source), its user 65534 on a read-only root, its certificates at
// /certs, and the management server reached as envoy-gateway. Only the
// xDS port and the Redis address differ: the management server is this
// test's (go-control-plane's server and snapshot cache, mutual TLS, as
// EG's), and Redis a container. weir becomes healthy on the probes' path,
// loads the config over xDS, answers Envoy's ShouldRateLimit over TLS
// exactly, refuses a bad update, and serves metrics on the metrics port.
func TestEnvoyGatewayDeployment(t *testing.T) {
	pki := certtest.New(t)
	// The envoy-rate-limit Secret: weir's certificate (also its xDS
	// client certificate) and the CA, readable by user 65534.
	certs := t.TempDir()
	os.Chmod(certs, 0o755)
	for src, dst := range map[string]string{pki.Cert: "tls.crt", pki.Key: "tls.key", pki.CA: "ca.crt"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certs, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The management server, as envoy-gateway: its certificate names it.
	xcert, xkey := filepath.Join(t.TempDir(), "xds.crt"), filepath.Join(t.TempDir(), "xds.key")
	pki.IssueFor(xcert, xkey, "envoy-gateway", "envoy-gateway")
	pair, err := tls.LoadX509KeyPair(xcert, xkey)
	if err != nil {
		t.Fatal(err)
	}
	xds := xdstest.Start(t, "0.0.0.0:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pki.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, "envoy-ratelimit")
	_, xport, _ := net.SplitHostPort(xds.Addr)

	redis := docker(t, append([]string{"run", "-d", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", redisImg}, redisArgs()...)...)
	t.Cleanup(func() { dockerErr("rm", "-f", "-v", redis) })
	redisIP := docker(t, "inspect", "-f", "{{.NetworkSettings.IPAddress}}", redis)
	waitRedis(t, redisIP, "6379")

	args := []string{"run", "-d", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--user", "65534:65534", "--add-host", "envoy-gateway:host-gateway", "-v", certs + ":/certs:ro",
		"--entrypoint", xdstest.EnvoyGatewayCommand[0],
		"-p", "127.0.0.1::8080", "-p", "127.0.0.1::8081", "-p", "127.0.0.1::19001"}
	for _, kv := range xdstest.EnvoyGatewayEnv {
		v := kv[1]
		switch kv[0] {
		case "CONFIG_GRPC_XDS_SERVER_URL":
			v = "envoy-gateway:" + xport
		case "REDIS_URL":
			v = redisIP + ":6379"
		}
		args = append(args, "-e", kv[0]+"="+v)
	}
	id := docker(t, append(args, weirImg)...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", id).CombinedOutput()
			t.Logf("container logs:\n%s", logs)
		}
		dockerErr("rm", "-f", "-v", id)
	})
	base := "http://" + hostPort(t, id, "8080/tcp")
	grpcAddr := hostPort(t, id, "8081/tcp")
	metrics := "http://" + hostPort(t, id, "19001/tcp") + "/metrics"

	// The probes: FORCE_START_WITHOUT_INITIAL_CONFIG=true, so healthy
	// before any config.
	waitFor(t, base+xdstest.EnvoyGatewayProbePath, http.StatusOK)
	xds.Set("1", xdstest.Limit("httproute/default/backend/rule/0", "envoy-gateway-system/eg/http", "rule-0-match-0", "rule-0-match-0", 3, rlsconfv3.RateLimitUnit_HOUR))
	xds.WaitRequest("ACK of version 1 from the container", xdstest.ACK("1"))

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfig(false))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	call := func() (rlspb.RateLimitResponse_Code, error) {
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "envoy-gateway-system/eg/http",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "rule-0-match-0", Value: "rule-0-match-0"}}}}})
		return resp.GetOverallCode(), err
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	ok := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, err := call()
			if err != nil {
				t.Error(err)
				return
			}
			if code == rlspb.RateLimitResponse_OK {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 3 {
		t.Fatalf("3/hour from xDS admitted %d of 20 concurrent calls", ok)
	}

	// A bad update is NACKed; the limit in force stays.
	xds.Set("2", xdstest.Limit("a", "envoy-gateway-system/eg/http", "k", "v", 1, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("b", "envoy-gateway-system/eg/http", "k", "w", 1, rlsconfv3.RateLimitUnit_MINUTE))
	xds.WaitRequest("NACK of version 2", xdstest.NACK("already defined"))
	if code, err := call(); err != nil || code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the refused update: %v %v, want OVER_LIMIT from version 1", code, err)
	}

	resp, err := http.Get(metrics)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "weir_decisions_total") {
		t.Fatalf("metrics on :19001: %d %.300s", resp.StatusCode, body)
	}
}


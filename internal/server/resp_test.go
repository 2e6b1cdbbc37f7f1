package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir/internal/redistest"
)

// startRESP starts a server with its RESP listener and returns the
// listener's address and the HTTP server (for /metrics).
func startRESP(t *testing.T, opts ...Option) (string, string) {
	t.Helper()
	s, ts := newTestServer(t, opts...)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ServeRESP(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.shutdownRESP(context.Background()) })
	return l.Addr().String(), ts.URL
}

// stores runs f on the memory store and on Redis.
func stores(t *testing.T, f func(t *testing.T, redisURL string)) {
	t.Run("memory", func(t *testing.T) { f(t, "") })
	t.Run("redis", func(t *testing.T) {
		if !redistest.Available() {
			t.Skip("redis-server not installed")
		}
		f(t, "redis://"+redistest.Standalone(t).Addr)
	})
}

// withRedis adds the Redis store at url, if any, to opts, with a store
// timeout loose enough for a loaded machine under -race (2s, as the
// package's other Redis tests have; a WithConfig in opts replaces it): a
// decision that times out answers an error, and may have been made.
func withRedis(t testing.TB, url string, opts ...Option) []Option {
	if url == "" {
		return opts
	}
	cfg := WithConfig(mustParse(t, testConfig+"store:\n  timeout: 2s\n"))
	return append(append([]Option{cfg}, opts...), WithRedisURL(url))
}

// TestRESPClients calls CL.THROTTLE, GCRA and WEIR.CHECK from clients
// weir did not write: rueidis, redis-cli and redis-py, with a token, and
// checks the metrics count the decisions under fixed rule labels.
func TestRESPClients(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		const token = "resp-token-0123456789abcdef"
		addr, httpURL := startRESP(t, withRedis(t, url, WithRESPToken(token))...)
		host, port, _ := net.SplitHostPort(addr)

		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, Password: token, DisableCache: true})
		if err != nil {
			t.Fatalf("rueidis: %v", err)
		}
		defer c.Close()
		ctx := context.Background()
		for _, tc := range []struct {
			cmd  []string
			want string
		}{
			{[]string{"CL.THROTTLE", "user1", "2", "1", "60"}, "[0 3 2 -1 60]"},
			{[]string{"CL.THROTTLE", "user1", "2", "1", "60", "3"}, "[1 3 2 60 60]"},
			{[]string{"GCRA", "user2", "2", "1", "60", "TOKENS", "3"}, "[0 3 0 -1 180]"},
			{[]string{"GCRA", "user2", "2", "1", "60"}, "[1 3 0 60 180]"},
		} {
			got, err := c.Do(ctx, c.B().Arbitrary(tc.cmd[0]).Args(tc.cmd[1:]...).Build()).AsIntSlice()
			if err != nil || fmt.Sprint(got) != tc.want {
				t.Errorf("rueidis %v: %v %v, want %s", tc.cmd, got, err, tc.want)
			}
		}
		got, err := c.Do(ctx, c.B().Arbitrary("WEIR.CHECK").Args("api", "k1").Build()).AsIntSlice()
		if err != nil || got[0] != 0 || got[1] != 5 || got[2] != 4 || got[3] != -1 {
			t.Errorf("rueidis WEIR.CHECK: %v %v", got, err)
		}

		if _, err := exec.LookPath("redis-cli"); err == nil {
			out, err := exec.Command("redis-cli", "-h", host, "-p", port, "--no-auth-warning", "-a", token,
				"CL.THROTTLE", "cli", "0", "1", "60").CombinedOutput()
			if err != nil || strings.Join(strings.Fields(string(out)), " ") != "0 1 0 -1 60" {
				t.Errorf("redis-cli CL.THROTTLE: %q %v", out, err)
			}
			out, err = exec.Command("redis-cli", "-h", host, "-p", port, "--no-auth-warning", "-a", token,
				"GCRA", "cli", "0", "1", "60").CombinedOutput()
			if err != nil || strings.Join(strings.Fields(string(out)), " ") != "1 1 0 60 60" {
				t.Errorf("redis-cli GCRA on the key CL.THROTTLE used: %q %v", out, err)
			}
			out, err = exec.Command("redis-cli", "-h", host, "-p", port, "--no-auth-warning", "-a", token,
				"WEIR.CHECK", "api", "cli").CombinedOutput()
			if f := strings.Fields(string(out)); err != nil || len(f) != 5 || f[0] != "0" || f[2] != "4" {
				t.Errorf("redis-cli WEIR.CHECK: %q %v", out, err)
			}
		}

		if exec.Command("/usr/bin/python3", "-c", "import redis").Run() == nil {
			script := `
import sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), password=sys.argv[3], protocol=2) if False else redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), password=sys.argv[3])
print(r.ping())
print(r.execute_command("CL.THROTTLE", "py", 1, 1, 60))
print(r.execute_command("GCRA", "py2", 1, 1, 60, "TOKENS", 2))
print(r.execute_command("WEIR.CHECK", "api", "py")[:3])
p = r.pipeline(transaction=False)
for _ in range(3):
    p.execute_command("CL.THROTTLE", "py3", 1, 1, 60)
print([x[0] for x in p.execute()])
`
			out, err := exec.Command("/usr/bin/python3", "-c", script, host, port, token).CombinedOutput()
			want := "True\n[0, 2, 1, -1, 60]\n[0, 2, 0, -1, 120]\n[0, 5, 4]\n[0, 0, 1]\n"
			if err != nil || string(out) != want {
				t.Errorf("redis-py: %v\n%s\nwant\n%s", err, out, want)
			}
		} else {
			t.Log("python3-redis not installed; skipping redis-py")
		}

		_, body := call(t, "GET", httpURL+"/metrics", "")
		for _, want := range []string{`weir_decisions_total{result="allowed",rule="cl.throttle"}`, `weir_decisions_total{result="limited",rule="gcra"}`} {
			if !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})
}

// TestRESPBenchmarkClient runs redis-benchmark's pipelined CL.THROTTLE
// against the listener: every request answered, no error, and no warning
// (it reads CONFIG GET save and appendonly first).
func TestRESPBenchmarkClient(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		t.Skip("redis-benchmark not installed")
	}
	addr, _ := startRESP(t)
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-n", "5000", "-c", "8", "-P", "16", "-q",
		"CL.THROTTLE", "bench", "1000000", "1000000", "1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "requests per second") || strings.Contains(string(out), "WARNING") {
		t.Errorf("redis-benchmark: %v\n%s", err, out)
	}
}

// TestRESPExact hammers one key from many connections, pipelining, and
// checks that exactly the limit is admitted: on the memory store, on
// Redis, and from two instances sharing one Redis.
func TestRESPExact(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		a, _ := startRESP(t, withRedis(t, url)...)
		addrs := []string{a}
		if url != "" {
			b, _ := startRESP(t, withRedis(t, url, WithInstanceID("second"))...)
			addrs = append(addrs, b)
		}
		exactUnderPipelines(t, addrs, 16, 10, 20)
	})
}

// exactUnderPipelines sends conns*pipes pipelines of depth CL.THROTTLE
// commands on one key, spread over addrs, and checks that max_burst+1 of
// them are admitted (a period of a day refills nothing in the test).
func exactUnderPipelines(t *testing.T, addrs []string, conns, pipes, depth int) {
	const burst = 299
	var admitted atomic.Int64
	var wg sync.WaitGroup
	cmd := fmt.Sprintf("*5\r\n$11\r\nCL.THROTTLE\r\n$3\r\nhot\r\n$3\r\n%d\r\n$1\r\n1\r\n$5\r\n86400\r\n", burst)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addrs[i%len(addrs)])
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			for range pipes {
				if _, err := io.WriteString(c, strings.Repeat(cmd, depth)); err != nil {
					t.Error(err)
					return
				}
				for range depth {
					limited, err := readThrottle(r)
					if err != nil {
						t.Error(err)
						if !errors.As(err, new(respError)) {
							return // the stream is out of step
						}
						continue
					}
					if !limited {
						admitted.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != burst+1 {
		t.Errorf("admitted %d of %d; want exactly %d", got, conns*pipes*depth, burst+1)
	}
}

// respError is an error reply.
type respError string

func (e respError) Error() string { return "error reply: " + string(e) }

// readThrottle reads one reply of CL.THROTTLE and returns whether it was
// limited; an error reply (one line) is returned as a respError, after
// which the stream is still in step.
func readThrottle(r *bufio.Reader) (limited bool, err error) {
	line, err := r.ReadString('\n')
	switch {
	case err != nil:
		return false, err
	case strings.HasPrefix(line, "-"):
		return false, respError(strings.TrimSpace(line[1:]))
	case line != "*5\r\n":
		return false, fmt.Errorf("reply %q; want an array of 5 integers", line)
	}
	var first string
	for i := range 5 {
		v, err := r.ReadString('\n')
		if err != nil {
			return false, err
		}
		if !strings.HasPrefix(v, ":") {
			return false, fmt.Errorf("element %d of the reply is %q; want an integer", i, v)
		}
		if i == 0 {
			first = v
		}
	}
	return first != ":0\r\n", nil
}

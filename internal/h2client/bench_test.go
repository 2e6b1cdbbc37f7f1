package h2client

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/store/memstore"
)

var (
	h2Rounds  = flag.Int("h2rounds", 5, "BenchmarkH2Client: rounds, each running every client once, in turn")
	h2Callers = flag.Int("h2callers", 16, "BenchmarkH2Client: callers, each with its own connection (weir bench's default)")
)

// BenchmarkH2Client measures the CPU time per ShouldRateLimit call of three
// gRPC clients against weir's own gRPC server (server.Server on the memory
// store, an Envoy domain "bench" at 100/s per client) running in a child
// process, so that the server's CPU is not counted as the client's:
//
//   - lean: this package's Client, weir bench's default;
//   - net-http: net/http's own cleartext HTTP/2 (http.Protocols with
//     SetUnencryptedHTTP2, Go 1.24+), the request and the answer handled
//     as lean handles them;
//   - grpc-go: grpc-go's generated client, weir bench --grpc-client grpc-go.
//
// Each client makes b.N calls from -h2callers goroutines, each with its own
// connection, and reports cpu-ns/op: this process's user+sys time per call
// by getrusage (the client, its goroutines, the runtime and the GC), and
// server-cpu-ns/op, the child's, from /proc. The clients take turns round
// after round, so that a slow spell of a shared machine falls on them all,
// and the end logs each one's min/median/max over the rounds. Run with a
// fixed count of calls and -v to see the summary:
//
//	go test -run '^$' -bench H2Client -benchtime 20000x -v ./internal/h2client
func BenchmarkH2Client(b *testing.B) {
	addr, serverPID := startServerProcess(b)
	clients := []string{"lean", "net-http", "grpc-go"}
	cpu := map[string][]float64{}
	for round := 1; round <= *h2Rounds; round++ {
		for _, client := range clients {
			b.Run(fmt.Sprintf("round=%d/client=%s", round, client), func(b *testing.B) {
				perCall := driveCalls(b, client, addr, serverPID)
				if len(cpu[client]) < round {
					cpu[client] = append(cpu[client], 0)
				}
				cpu[client][round-1] = perCall // the last, reported run of this round
			})
		}
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "client CPU per call over %d rounds, min / median / max:", *h2Rounds)
	med := map[string]float64{}
	for _, client := range clients {
		v := slices.Sorted(slices.Values(cpu[client]))
		if len(v) == 0 {
			continue
		}
		med[client] = v[len(v)/2]
		fmt.Fprintf(&sum, "\n  %-8s  %5.1f / %5.1f / %5.1f µs", client, v[0]/1e3, med[client]/1e3, v[len(v)-1]/1e3)
	}
	if med["lean"] > 0 {
		fmt.Fprintf(&sum, "\n  medians: net-http / lean = %.2f, grpc-go / lean = %.2f", med["net-http"]/med["lean"], med["grpc-go"]/med["lean"])
	}
	b.Log(sum.String())
}

// call is one client's ShouldRateLimit.
type call func(ctx context.Context, key string) (bool, error)

// newCalls returns n connections' calls of the client named client, and
// the function that closes them.
func newCalls(b *testing.B, client, addr string, n int) ([]call, func()) {
	out := make([]call, n)
	var closers []func()
	for i := range out {
		switch client {
		case "lean":
			cl := New(addr, "bench", false)
			out[i], closers = cl.ShouldRateLimit, append(closers, cl.Close)
		case "net-http":
			p := new(http.Protocols)
			p.SetUnencryptedHTTP2(true)
			tr := &http.Transport{Protocols: p, DisableCompression: true}
			out[i], closers = netHTTPCall(tr, addr, "bench"), append(closers, tr.CloseIdleConnections)
		case "grpc-go":
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			rc := rls.NewRateLimitServiceClient(cc)
			out[i] = func(ctx context.Context, key string) (bool, error) {
				resp, err := rc.ShouldRateLimit(ctx, &rls.RateLimitRequest{
					Domain:      "bench",
					Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "client", Value: key}}}},
					HitsAddend:  1,
				})
				if err != nil {
					return false, err
				}
				return resp.OverallCode != rls.RateLimitResponse_OVER_LIMIT, nil
			}
			closers = append(closers, func() { cc.Close() })
		}
	}
	return out, func() {
		for _, f := range closers {
			f()
		}
	}
}

// grpcRequestHeader is the net-http client's request header, shared
// read-only by every request.
var grpcRequestHeader = http.Header{
	"Content-Type": {"application/grpc"},
	"Te":           {"trailers"},
	"User-Agent":   {"weir-bench"},
}

// netHTTPCall makes ShouldRateLimit calls through tr, which speaks
// cleartext HTTP/2: a POST of the gRPC-framed request, whose status comes
// back in the trailers (or, for a trailers-only answer, in the headers).
func netHTTPCall(tr *http.Transport, addr, domain string) call {
	u := &url.URL{Scheme: "http", Host: addr, Path: rlsPath}
	var body, msg bytes.Buffer // one call at a time per connection
	return func(ctx context.Context, key string) (bool, error) {
		body.Reset()
		body.Write(appendRLSRequest(body.AvailableBuffer(), domain, key, 1))
		req := (&http.Request{
			Method: http.MethodPost, URL: u, Host: u.Host, Header: grpcRequestHeader,
			Proto: "HTTP/2.0", ProtoMajor: 2,
			Body: io.NopCloser(bytes.NewReader(body.Bytes())), ContentLength: int64(body.Len()),
		}).WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("HTTP status %d from %s", resp.StatusCode, rlsPath)
		}
		h := respHeaders{status: "200", contentType: resp.Header.Get("Content-Type")}
		if !isGRPCContentType(h.contentType) {
			return false, fmt.Errorf("response content-type %q, want application/grpc", h.contentType)
		}
		msg.Reset()
		if _, err := msg.ReadFrom(io.LimitReader(resp.Body, maxResponse+1)); err != nil {
			return false, err
		}
		if msg.Len() > maxResponse {
			return false, fmt.Errorf("response larger than %d bytes", maxResponse)
		}
		trailer := resp.Trailer
		if _, ok := trailer["Grpc-Status"]; !ok {
			trailer = resp.Header
		}
		if v := trailer["Grpc-Status"]; len(v) > 0 {
			h.grpcStatus, h.hasGRPCStatus = v[0], true
		}
		h.grpcMessage = trailer.Get("Grpc-Message")
		return callResult(&h, msg.Bytes())
	}
}

// driveCalls makes b.N calls of client from -h2callers goroutines, one
// connection each, and reports the CPU time per call of this process and
// of the server's.
func driveCalls(b *testing.B, client, addr string, serverPID int) float64 {
	calls, closeAll := newCalls(b, client, addr, *h2Callers)
	defer closeAll()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	ctx := context.Background()
	for _, call := range calls { // dial, and fill the HPACK tables
		for range 3 {
			if _, err := call(ctx, keys[0]); err != nil {
				b.Fatal(err)
			}
		}
	}
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	srv0, self0 := procCPU(b, serverPID), selfCPU()
	b.ResetTimer()
	for w, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; next.Add(1) <= int64(b.N); i++ {
				if _, err := call(ctx, keys[i%len(keys)]); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	self, srv := selfCPU()-self0, procCPU(b, serverPID)-srv0
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	perCall := float64(self) / float64(b.N)
	b.ReportMetric(perCall, "cpu-ns/op")
	b.ReportMetric(float64(srv)/float64(b.N), "server-cpu-ns/op")
	return perCall
}

// selfCPU is this process's user+sys CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is process pid's user+sys CPU time so far, from /proc/<pid>/stat
// (Linux; in ticks of 10 ms).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// After the parenthesised command name come state (field 3), ...,
	// utime (14) and stime (15).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

// startServerProcess starts this test binary again as the server (see
// TestServerProcess) and returns its gRPC address and pid.
func startServerProcess(b *testing.B) (string, int) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerProcess$")
	cmd.Env = append(os.Environ(), "WEIR_H2CLIENT_SERVER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "grpc ")
	if err != nil || !ok {
		b.Fatalf("server process: %q, %v", line, err)
	}
	return addr, cmd.Process.Pid
}

// TestServerProcess is BenchmarkH2Client's server when
// $WEIR_H2CLIENT_SERVER is set (and is skipped otherwise): weir's server,
// as `weir serve` runs it, on the memory store with the Envoy domain
// "bench". It prints "grpc <address>" and serves until killed.
func TestServerProcess(t *testing.T) {
	if os.Getenv("WEIR_H2CLIENT_SERVER") == "" {
		t.Skip("BenchmarkH2Client's server process")
	}
	ecfg, err := envoyrls.Parse([]byte("domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), "bench.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.WithStore(memstore.New()), server.WithEnvoyConfig(ecfg),
		server.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("grpc %s\n", gl.Addr())
	t.Fatal(srv.Serve(context.Background(), hl, gl))
}

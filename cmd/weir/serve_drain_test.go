package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestServeSIGTERMUnreadyBeforeClosing runs weir serve as a real process
// under continuous requests from clients that behave as a load balancer
// does: they keep connections alive, and stop sending new requests to the
// instance once its readiness probe fails. On SIGTERM the instance must go
// unready while it still serves, answer every request sent to it, and
// only then close its listener and exit 0.
func TestServeSIGTERMUnreadyBeforeClosing(t *testing.T) {
	p := startServeProcess(t, "--http 127.0.0.1:0 --grpc 127.0.0.1:0 --log-level error --shutdown-timeout 20s --shutdown-delay 2s")
	cmd, exited, stderr := p.cmd, p.exited, p.stderr
	base := "http://" + p.addr

	var (
		unready   atomic.Bool // the balancer saw /readyz fail
		refused   atomic.Bool // the listener is closed
		orderBad  atomic.Bool // refused before unready was seen
		answered  atomic.Int64
		afterTerm atomic.Int64 // answered after SIGTERM
		termSent  atomic.Bool
		mu        sync.Mutex
		failures  []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	isRefused := func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

	// The balancer's readiness probe, on a fresh connection each time.
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for {
			resp, err := probe.Get(base + "/readyz")
			switch {
			case err == nil:
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					unready.Store(true)
				} else if resp.StatusCode != http.StatusOK {
					fail("readyz: %d", resp.StatusCode)
				}
			case isRefused(err) || unready.Load():
				// The listener is closed, or closing: a probe connection
				// the kernel accepted but weir never did is reset then,
				// which no server can prevent; what matters is that
				// readiness failed first.
				if !unready.Load() {
					orderBad.Store(true)
				}
				refused.Store(true)
				return
			default:
				fail("readyz: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	// The balanced traffic: keep-alive clients that send while the
	// instance is ready.
	var wg sync.WaitGroup
	for c := range 4 {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
		wg.Go(func() {
			for i := 0; !unready.Load() && !refused.Load(); i++ {
				body := fmt.Sprintf(`{"rule":"login","key":"192.0.2.%d","hits":1}`, (c*50+i)%250+1)
				resp, err := client.Post(base+"/v1/check", "application/json", strings.NewReader(body))
				if err != nil {
					if !isRefused(err) {
						fail("request %d of client %d, sent to a ready instance, got no answer: %v", i, c, err)
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
				if termSent.Load() {
					afterTerm.Add(1)
				}
			}
		})
	}

	time.Sleep(300 * time.Millisecond) // traffic flowing
	if answered.Load() == 0 {
		t.Fatalf("no traffic before SIGTERM; stderr: %s", stderr.String())
	}
	termSent.Store(true)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit 60s after SIGTERM (shutdown timeout 20s)\n%s", stderr.String())
	}
	wg.Wait()
	<-probeDone
	mu.Lock()
	defer mu.Unlock()
	for _, f := range failures {
		t.Error(f)
	}
	if orderBad.Load() || !unready.Load() {
		t.Fatalf("the listener closed before /readyz answered 503 (unready seen: %v)", unready.Load())
	}
	if afterTerm.Load() == 0 {
		t.Fatal("no request was answered after SIGTERM: the instance stopped serving at once")
	}
	t.Logf("%d requests answered, %d after SIGTERM", answered.Load(), afterTerm.Load())
}

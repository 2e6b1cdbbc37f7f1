package protect

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// trickle sends a POST to addr whose 10-byte body arrives a byte every
// gap, then reads the answer.
func trickle(addr string, gap time.Duration) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	for range 10 {
		time.Sleep(gap)
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// slowRead asks for a large answer and reads none of it for pause, then
// all of it.
func slowRead(addr string, pause time.Duration) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	time.Sleep(pause)
	_, err = io.Copy(io.Discard, c)
	return err
}

// Slow clients do not make a healthy route look slow: the time a handler
// spends blocked on its client (a trickled body, a client that reads
// slowly) is not latency the breaker or the adaptive limit counts. Five
// slowloris clients at a time, on a route whose handler itself takes no
// time, leave a slow_ratio breaker closed and everyone else served, and
// the adaptive limit where it started.
func TestSlowClientsDoNotOpenTheBreaker(t *testing.T) {
	for _, kind := range []string{"trickled body", "slow reader"} {
		t.Run(kind, func(t *testing.T) {
			r := mustRule(t, Config{Name: "api", Adaptive: true, InitialConcurrency: 20, MinConcurrency: 1, MaxConcurrency: 100,
				Breaker: &BreakerConfig{SlowCall: 300 * time.Millisecond, SlowRatio: 0.5, MinRequests: 5, Window: time.Minute, OpenFor: time.Minute}})
			chunk := []byte(strings.Repeat("y", 32<<10))
			srv := httptest.NewServer(r.Wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				_, _ = io.Copy(io.Discard, req.Body)
				if req.URL.Path == "/big" {
					for range 768 { // 24 MB: more than the sockets on both ends buffer
						if _, err := w.Write(chunk); err != nil {
							return
						}
					}
				}
			}), nil))
			defer srv.Close()
			addr := srv.Listener.Addr().String()

			var wg sync.WaitGroup
			errs := make(chan error, 10)
			for range 2 {
				for range 5 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if kind == "trickled body" {
							errs <- trickle(addr, 120*time.Millisecond)
						} else {
							errs <- slowRead(addr, 1500*time.Millisecond)
						}
					}()
				}
				wg.Wait()
			}
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("a slow client failed: %v", err)
				}
			}
			// The slow calls alone are past MinRequests: had their client
			// time counted, the breaker would be open now.
			if st := r.Stats(); st.State != Closed || st.Limit < 20 {
				t.Fatalf("after 10 slow clients: breaker %v, adaptive limit %d; want closed and at least 20 (where it started)", st.State, st.Limit)
			}
			for i := range 5 {
				resp, err := http.Post(srv.URL+"/fast", "text/plain", strings.NewReader("hi"))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("ordinary call %d: status %d, want 200", i+1, resp.StatusCode)
				}
			}
		})
	}
}

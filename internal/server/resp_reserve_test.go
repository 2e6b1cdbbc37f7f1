package server

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"
)

// respReserveRules: a token budget that refills a negligible 100 a day, so
// that a test sees exactly 100 admitted.
const respReserveRules = `
rules:
  - name: tokens
    limit: 100/d
    algorithm: token_bucket
  - name: slots
    limit: 3/m
    algorithm: concurrency
store:
  timeout: 2s
`

// respDo runs one command and returns its reply as a map (RESP3) of
// integers, with the reservation id apart.
func respDo(c rueidis.Client, args ...string) (map[string]int64, string, error) {
	m, err := c.Do(context.Background(), c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).AsMap()
	if err != nil {
		return nil, "", err
	}
	out := map[string]int64{}
	id := ""
	for k, v := range m {
		if k == "reservation" {
			id, _ = v.ToString()
			continue
		}
		if out[k], err = v.AsInt64(); err != nil {
			return nil, "", fmt.Errorf("%s: %w", k, err)
		}
	}
	return out, id, nil
}

func rueidisTo(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("rueidis: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestRESPReserveSettle reserves and settles over RESP with rueidis
// (RESP3, a map) and redis-py (RESP2, a flat array), and across the HTTP
// routes: the unused part is refunded, a settlement is made once, the
// refusals name the bad value.
func TestRESPReserveSettle(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		addr, httpURL := startRESP(t, withRedis(t, url, WithConfig(mustParse(t, respReserveRules)))...)
		c := rueidisTo(t, addr)
		d, id, err := respDo(c, "WEIR.RESERVE", "tokens", "r", "40")
		if err != nil || d["allowed"] != 1 || d["remaining"] != 60 || d["limit"] != 100 || len(id) != 32 || d["expires_in_ms"] != ReservationTTL.Milliseconds() {
			t.Fatalf("reserve 40: %v %q %v", d, id, err)
		}
		if d, _, err = respDo(c, "WEIR.SETTLE", id, "25"); err != nil || d["allowed"] != 1 || d["remaining"] != 75 {
			t.Fatalf("settle 25 of 40 (15 back, 75 remain): %v %v", d, err)
		}
		if _, _, err = respDo(c, "WEIR.SETTLE", id, "25"); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("reservation %q is unknown, expired or already settled", id)) {
			t.Fatalf("settled twice: %v", err)
		}
		// More than remains: refused, nothing reserved, nothing taken.
		if d, id, err = respDo(c, "WEIR.RESERVE", "tokens", "r", "80"); err != nil || d["allowed"] != 0 || id != "" || d["remaining"] != 75 || d["retry_after_ms"] <= 0 {
			t.Fatalf("reserve 80 of 75: %v %q %v", d, id, err)
		}
		// Reserved over RESP, settled over HTTP, then refused over RESP.
		_, id, _ = respDo(c, "WEIR.RESERVE", "tokens", "r", "5")
		code, body, raw := post(t, httpURL+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":5}`, id))
		if code != 200 || body["remaining"].(float64) != 70 {
			t.Fatalf("HTTP settle of a RESP reservation: %d %s", code, raw)
		}
		if _, _, err = respDo(c, "WEIR.SETTLE", id, "0"); err == nil || !strings.Contains(err.Error(), "already settled") {
			t.Fatalf("RESP settle after the HTTP one: %v", err)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"WEIR.RESERVE", "nope", "k", "1"}, `no rule is named "nope"; the rules in force are: tokens, slots`},
			{[]string{"WEIR.RESERVE", "slots", "k", "1"}, `"slots"`},
			{[]string{"WEIR.RESERVE", "tokens", "k", "-3"}, "estimate is out of range"},
			{[]string{"WEIR.SETTLE", "0123456789abcdef0123456789abcdef", "1"}, `reservation "0123456789abcdef0123456789abcdef" is unknown`},
			{[]string{"WEIR.SETTLE", "x", "9999999999999999"}, "actual is 9999999999999999; it must be 0 to 2251799813685248"},
		} {
			if _, _, err := respDo(c, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
			}
		}

		if exec.Command("/usr/bin/python3", "-c", "import redis").Run() != nil {
			t.Log("python3-redis not installed; skipping redis-py")
			return
		}
		host, port, _ := net.SplitHostPort(addr)
		script := `
import sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]))
a = r.execute_command("WEIR.RESERVE", "tokens", "py", 30)
d = dict(zip(a[0::2], a[1::2]))
print(d[b"allowed"], d[b"remaining"], len(d[b"reservation"]))
s = r.execute_command("WEIR.SETTLE", d[b"reservation"], 10)
s = dict(zip(s[0::2], s[1::2]))
print(s[b"allowed"], s[b"remaining"])
try:
    r.execute_command("WEIR.SETTLE", d[b"reservation"], 10)
except redis.ResponseError as e:
    print("refused:", "already settled" in str(e))
`
		out, err := exec.Command("/usr/bin/python3", "-c", script, host, port).CombinedOutput()
		if want := "1 70 32\n1 90\nrefused: True\n"; err != nil || string(out) != want {
			t.Errorf("redis-py: %v\n%s\nwant\n%s", err, out, want)
		}
	})
}

// TestRESPReserveExact reserves on one key from many rueidis connections
// at once, pipelining, and checks that exactly the limit is admitted;
// settling every reservation at 0 refunds it all. On Redis, two instances
// share the key.
func TestRESPReserveExact(t *testing.T) {
	stores(t, func(t *testing.T, url string) {
		cfg := WithConfig(mustParse(t, respReserveRules))
		a, _ := startRESP(t, withRedis(t, url, cfg)...)
		addrs := []string{a}
		if url != "" {
			b, _ := startRESP(t, withRedis(t, url, cfg, WithInstanceID("second"))...)
			addrs = append(addrs, b)
		}
		reserveExactly(t, addrs, "hot", 100)
	})
}

// reserveExactly sends 16 connections' pipelines of WEIR.RESERVE rule
// tokens on key, 4 times the limit in all, checks that limit are
// admitted, settles each at 0 and checks the key is whole again.
func reserveExactly(t *testing.T, addrs []string, key string, limit int) {
	t.Helper()
	const conns, depth = 16, 25
	var (
		mu  sync.Mutex
		ids []string
		bad atomic.Int64
		wg  sync.WaitGroup
	)
	clients := make([]rueidis.Client, conns)
	for i := range clients {
		// One connection each: rueidis pipelines DoMulti on it.
		clients[i] = rueidisTo(t, addrs[i%len(addrs)])
	}
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmds := make(rueidis.Commands, depth)
			for j := range cmds {
				cmds[j] = c.B().Arbitrary("WEIR.RESERVE").Args("tokens", key, "1").Build()
			}
			for _, r := range c.DoMulti(context.Background(), cmds...) {
				m, err := r.AsMap()
				if err != nil {
					bad.Add(1)
					t.Error(err)
					continue
				}
				rid, al := m["reservation"], m["allowed"]
				id, _ := rid.ToString()
				if a, _ := al.AsInt64(); a == 1 && id == "" {
					// Admitted with nothing to settle: the on_error
					// fallback decided, so the count says nothing.
					bad.Add(1)
					t.Error("admitted without a reservation (the store failed)")
				}
				if id != "" {
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(ids) != limit || bad.Load() != 0 {
		t.Fatalf("admitted %d of %d reservations; want exactly %d", len(ids), conns*depth, limit)
	}
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := respDo(clients[i%conns], "WEIR.SETTLE", id, "0"); err != nil {
				t.Errorf("settle %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	// Spent, the key would refuse even 1; refunded (less the trickle the
	// refill made since each take, as /v1/settle refunds), it admits 90.
	d, _, err := respDo(clients[0], "WEIR.RESERVE", "tokens", key, fmt.Sprint(limit*9/10))
	if err != nil || d["allowed"] != 1 {
		t.Errorf("after settling every reservation at 0, reserve 90%% of the limit: %v %v", d, err)
	}
}

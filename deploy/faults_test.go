//go:build fleet

package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fault tests: weir and Redis each in a container of their own, on
// private networks this run creates, with faults made by Docker (network
// disconnect and connect, kill, stop and start). Each test measures what it
// asserts and logs the figures docs/operations.md ("Faults across hosts")
// records; the assertions use bounds wide enough not to flake on a busy
// machine.

// fnet is a private Docker network with a /24 of its own, so that a
// container keeps its address across a restart or a reconnect (Docker gives
// fixed addresses only on a subnet chosen by the user).
type fnet struct{ name, prefix string }

func (n fnet) ip(host int) string { return fmt.Sprintf("%s%d", n.prefix, host) }

// newNet creates a network named after the run and label on a random
// 10.x.y.0/24 that no interface of this machine uses, trying others while
// Docker reports an overlap; it is removed when the test ends.
func newNet(t *testing.T, label string) fnet {
	t.Helper()
	name := "weir-" + runID + "-" + label
	var last error
	for range 30 {
		a, b := 64+rand.IntN(128), rand.IntN(256)
		prefix := fmt.Sprintf("10.%d.%d.", a, b)
		if hostUses(prefix) {
			continue
		}
		_, err := dockerErr("network", "create", "--subnet", prefix+"0/24", "--gateway", prefix+"1", name)
		if err == nil {
			t.Cleanup(func() { exec.Command("docker", "network", "rm", name).Run() })
			return fnet{name, prefix}
		}
		last = err
	}
	t.Fatalf("no free subnet for network %s: %v", name, last)
	return fnet{}
}

// hostUses says whether an interface of this machine has an address that
// starts with prefix.
func hostUses(prefix string) bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), prefix) {
			return true
		}
	}
	return false
}

// at is a container's place on a network: the network and the host part of
// its fixed address.
type at struct {
	net  fnet
	host int
}

func (a at) ip() string { return a.net.ip(a.host) }

// startContainer creates a container on its networks (the first at create,
// the others connected before it starts), each at a fixed address, and
// starts it. It is removed, with its logs in the test's output on failure,
// when the test ends.
func startContainer(t *testing.T, name string, nets []at, dockerArgs []string, image string, args ...string) {
	t.Helper()
	create := append([]string{"create", "--name", name, "--network", nets[0].net.name, "--ip", nets[0].ip(),
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges"}, dockerArgs...)
	create = append(append(create, image), args...)
	docker(t, create...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", "--tail", "60", name).CombinedOutput()
			t.Logf("%s logs:\n%s", name, logs)
		}
		exec.Command("docker", "rm", "-f", "-v", name).Run()
	})
	for _, n := range nets[1:] {
		docker(t, "network", "connect", "--ip", n.ip(), n.net.name, name)
	}
	docker(t, "start", name)
}

// cutOff disconnects a container from a network; heal connects it again
// at the same address.
func cutOff(t *testing.T, name string, n at) {
	t.Helper()
	docker(t, "network", "disconnect", "-f", n.net.name, name)
}

func heal(t *testing.T, name string, n at) {
	t.Helper()
	docker(t, "network", "connect", "--ip", n.ip(), n.net.name, name)
}

// weirNode is one weir serve container, reached by the test at base.
type weirNode struct{ name, base string }

// startWeirNode runs weir's image with config as its weir.yaml, on nets;
// the test reaches it on the first. It waits until /readyz answers.
func startWeirNode(t *testing.T, name, config string, nets []at, weirArgs ...string) weirNode {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	cfg := filepath.Join(dir, "weir.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--config", "/etc/weir/weir.yaml", "--instance-id", name, "--log-format", "json"}, weirArgs...)
	startContainer(t, name, nets, []string{"--read-only", "-v", cfg + ":/etc/weir/weir.yaml:ro"}, weirImg, args...)
	w := weirNode{name, "http://" + nets[0].ip() + ":8080"}
	waitFor(t, w.base+"/readyz", http.StatusOK)
	return w
}

// redisArgs are the flags every Redis of these tests runs with: no
// persistence, reachable from the private networks only.
func redisArgs(extra ...string) []string {
	return append([]string{"--bind", "0.0.0.0", "--port", "6379", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", "/tmp"}, extra...)
}

// startRedis runs the Redis image as a primary or, with --replicaof in
// extra, a replica.
func startRedis(t *testing.T, name string, nets []at, extra ...string) {
	t.Helper()
	startContainer(t, name, nets, []string{"--read-only", "--tmpfs", "/tmp"}, redisImg, redisArgs(extra...)...)
	waitRedis(t, nets[0].ip(), "6379")
}

// startSentinel runs the same image as a Sentinel: its config file, which
// Sentinel rewrites, lives in a directory of its own mounted read-write.
func startSentinel(t *testing.T, name string, nets []at, conf string) {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	if err := os.WriteFile(filepath.Join(dir, "sentinel.conf"), []byte(conf), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "sentinel.conf"), 0o666)
	startContainer(t, name, nets, []string{"--read-only", "-v", dir + ":/sentinel"}, redisImg, "/sentinel/sentinel.conf", "--sentinel")
	waitRedis(t, nets[0].ip(), "26379")
}

// rcli runs redis-cli against a container's Redis or Sentinel.
func rcli(ip, port string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", append([]string{"-h", ip, "-p", port}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func waitRedis(t *testing.T, ip, port string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := rcli(ip, port, "PING")
		if err == nil && out == "PONG" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis at %s:%s: no PONG within 20s: %v %s", ip, port, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// decision is what the tests read of /v1/check's answer.
type decision struct {
	Allowed   bool   `json:"allowed"`
	Remaining int64  `json:"remaining"`
	Fallback  string `json:"fallback"`
}

// decide asks weir at base to decide one hit of rule for key.
func decide(c *http.Client, base, rule, key string) (decision, error) {
	var d decision
	body := fmt.Sprintf(`{"rule":%q,"key":%q}`, rule, key)
	resp, err := c.Post(base+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// 200 allows, 429 refuses; both carry the decision.
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return d, fmt.Errorf("/v1/check: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return d, json.Unmarshal(b, &d)
}

// mustDecide is decide that ends the test on an error.
func mustDecide(t *testing.T, base, rule, key string) decision {
	t.Helper()
	d, err := decide(&http.Client{Timeout: 10 * time.Second}, base, rule, key)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// within polls cond every 20ms for up to limit and returns how long it took
// to hold, or fails the test.
func within(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// TestFaultWeirCutOffFromRedis: three weir instances share one Redis; the
// test cuts weir-1's network to Redis (docker network disconnect) while it
// still reaches the clients. weir-1 then decides every rule by its own
// on_error (allow, deny, local), each answer well within a second (the
// store timeout is 50ms; the breaker then answers at once); weir-2 and
// weir-3 keep deciding exactly (40 of 60 on a 40/10m key); once the network
// is back, weir-1 decides with Redis again, and its key counts carry on
// from the others'.
func TestFaultWeirCutOffFromRedis(t *testing.T) {
	t.Parallel()
	clients, store := newNet(t, "cut-c"), newNet(t, "cut-s")
	redis := "weir-" + runID + "-cut-redis"
	startRedis(t, redis, []at{{store, 10}})
	config := fmt.Sprintf(`store:
  type: redis
  redis: {addrs: ["%s:6379"]}
  timeout: 50ms
instances: 3
rules:
  - {name: exact, limit: 40/10m, algorithm: sliding_log, on_error: deny}
  - {name: open, limit: 5/10m, algorithm: sliding_log, on_error: allow}
  - {name: closed, limit: 5/10m, algorithm: sliding_log, on_error: deny}
  - {name: local, limit: 9/10m, algorithm: sliding_log, on_error: local}
`, store.ip(10))
	var nodes []weirNode
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, startWeirNode(t, fmt.Sprintf("weir-%s-cut-%d", runID, i), config,
			[]at{{clients, 10 + i}, {store, 10 + i}}))
	}
	for _, n := range nodes {
		waitFor(t, n.base+"/healthz/store", http.StatusOK)
	}
	w1 := nodes[0]
	// Before the cut weir-1 decides with Redis.
	if d := mustDecide(t, w1.base, "exact", "warm"); !d.Allowed || d.Fallback != "" {
		t.Fatalf("before the cut: %+v", d)
	}

	cut := time.Now()
	cutOff(t, w1.name, at{store, 11})
	t.Cleanup(func() { exec.Command("docker", "network", "connect", "--ip", store.ip(11), store.name, w1.name).Run() })

	// weir-1 falls back: time to the first fallback decision, and the
	// slowest answer while cut off.
	c := &http.Client{Timeout: 10 * time.Second}
	var slowest time.Duration
	var firstFallback time.Duration
	var slow []string // decisions slower than 100ms, and when
	want := map[string]struct {
		fallback string
		allowed  bool
	}{"open": {"allow", true}, "closed": {"deny", false}, "local": {"local", true}}
	seen := map[string]int{}
	// At least 3 s, and until local has decided 4 times (3 admitted, then
	// refused) however slow a loaded machine makes the first answers.
	for i := 0; time.Since(cut) < 3*time.Second || len(seen) < 3 || seen["local"] < 4; i++ {
		if time.Since(cut) > 20*time.Second {
			t.Fatalf("weir-1 did not fall back on every rule within 20s: %v", seen)
		}
		rule := []string{"open", "closed", "local"}[i%3]
		start := time.Now()
		d, err := decide(c, w1.base, rule, "cut")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("weir-1 while cut off: %v", err)
		}
		slowest = max(slowest, took)
		if took > 100*time.Millisecond {
			slow = append(slow, fmt.Sprintf("%v at %v (fallback %q)", took.Round(time.Millisecond), time.Since(cut).Round(time.Millisecond), d.Fallback))
		}
		if d.Fallback == "" {
			continue
		}
		if firstFallback == 0 {
			firstFallback = time.Since(cut)
		}
		w := want[rule]
		// local admits the first 3 (9/10m over 3 instances), then refuses.
		if d.Fallback != w.fallback || (rule != "local" && d.Allowed != w.allowed) {
			t.Fatalf("rule %s while cut off: %+v; want fallback %s, allowed %v", rule, d, w.fallback, w.allowed)
		}
		if d.Allowed {
			seen[rule+"-allowed"]++
		}
		seen[rule]++
	}
	if seen["local-allowed"] != 3 {
		t.Errorf("on_error local admitted %d; want 3 (9/10m over 3 instances)", seen["local-allowed"])
	}
	if slowest > 5*time.Second {
		t.Errorf("the slowest decision while cut off took %v; want a few store timeouts at most", slowest)
	}

	// The others keep deciding exactly meanwhile.
	allowed := 0
	for i := range 60 {
		if mustDecide(t, nodes[1+i%2].base, "exact", "shared").Allowed {
			allowed++
		}
	}
	if allowed != 40 {
		t.Errorf("weir-2 and weir-3 allowed %d of 60 on a 40/10m key while weir-1 was cut off; want 40", allowed)
	}
	if n := metric(t, w1.base, "weir_fallback_decisions_total", ""); n == 0 {
		t.Error("weir_fallback_decisions_total is 0 on weir-1 after the cut")
	}

	// Heal: weir-1 returns to Redis; time from the reconnect to its first
	// decision made with Redis.
	heal(t, w1.name, at{store, 11})
	back := within(t, 10*time.Second, "weir-1 deciding with Redis after the heal", func() bool {
		d, err := decide(c, w1.base, "exact", "shared")
		return err == nil && d.Fallback == ""
	})
	// The key spent by the others is spent for weir-1 too. A decision or
	// two just after the first one Redis made may still fall back (another
	// of the client's connections still timing out): never admitted, since
	// the rule is on_error deny; counted and reported, and within 2 s every
	// decision is Redis's.
	lateFallbacks := 0
	within(t, 2*time.Second, "weir-1 refusing the spent key by Redis after the heal", func() bool {
		d := mustDecide(t, w1.base, "exact", "shared")
		if d.Allowed {
			t.Fatalf("weir-1 after the heal admitted a spent key: %+v", d)
		}
		if d.Fallback != "" {
			lateFallbacks++
		}
		return d.Fallback == ""
	})
	waitFor(t, w1.base+"/healthz/store", http.StatusOK)
	t.Logf("measured: first fallback %v after the cut; slowest decision while cut off %v; "+
		"back on Redis %v after the heal (%v since the cut); fallbacks after the first Redis decision %d; local admitted %d of %d; decisions over 100ms: %v",
		firstFallback.Round(time.Millisecond), slowest.Round(time.Millisecond), back.Round(time.Millisecond),
		time.Since(cut).Round(time.Millisecond), lateFallbacks, seen["local-allowed"], seen["local"], slow)
}

// sentinelGroup is a Redis primary, its replicas and three Sentinels
// watching it under the name "weir".
type sentinelGroup struct {
	primary   string // container name
	primaryAt at     // the address the Sentinels and replicas know it by
	replicas  []string
	replicaAt []at
	sentinels []string
	sentAt    []at // where clients reach the Sentinels
}

// startSentinelGroup starts a primary on pnets, replicas on rnets (each
// announcing its address on the first of them) and three Sentinels on
// snets (announcing theirs on the first). host numbers the addresses from
// base on every network. extra goes to the primary and the replicas.
func startSentinelGroup(t *testing.T, label string, pnets []fnet, rnets []fnet, snets []fnet, replicas int, extra ...string) *sentinelGroup {
	t.Helper()
	g := &sentinelGroup{}
	place := func(nets []fnet, host int) []at {
		var a []at
		for _, n := range nets {
			a = append(a, at{n, host})
		}
		return a
	}
	g.primary = "weir-" + runID + "-" + label + "-primary"
	pat := place(pnets, 20)
	g.primaryAt = pat[0]
	startRedis(t, g.primary, pat, append([]string{"--replica-announce-ip", pat[0].ip()}, extra...)...)
	for i := range replicas {
		name := fmt.Sprintf("weir-%s-%s-replica%d", runID, label, i+1)
		rat := place(rnets, 21+i)
		startRedis(t, name, rat, append([]string{"--replicaof", g.primaryAt.ip(), "6379", "--replica-announce-ip", rat[0].ip()}, extra...)...)
		g.replicas = append(g.replicas, name)
		g.replicaAt = append(g.replicaAt, rat[0])
	}
	for i := range 3 {
		name := fmt.Sprintf("weir-%s-%s-sentinel%d", runID, label, i+1)
		sat := place(snets, 30+i)
		conf := fmt.Sprintf(`port 26379
bind 0.0.0.0
protected-mode no
dir /sentinel
sentinel announce-ip %s
sentinel monitor weir %s 6379 2
sentinel down-after-milliseconds weir 1500
sentinel failover-timeout weir 6000
sentinel parallel-syncs weir 2
`, sat[0].ip(), g.primaryAt.ip())
		startSentinel(t, name, sat, conf)
		g.sentinels = append(g.sentinels, name)
		g.sentAt = append(g.sentAt, sat[0])
	}
	// Ready: every Sentinel knows the replicas and the two other Sentinels.
	within(t, 30*time.Second, "the Sentinels to see the group", func() bool {
		for _, s := range g.sentAt {
			r, err1 := rcli(s.ip(), "26379", "SENTINEL", "REPLICAS", "weir")
			o, err2 := rcli(s.ip(), "26379", "SENTINEL", "SENTINELS", "weir")
			if err1 != nil || err2 != nil || fields(r, "name") < replicas || fields(o, "name") < 2 {
				return false
			}
		}
		return true
	})
	return g
}

// fields counts the lines of redis-cli's output that are exactly name.
func fields(out, name string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == name {
			n++
		}
	}
	return n
}

// master is the address a Sentinel gives for the primary.
func (g *sentinelGroup) master(s at) string {
	out, err := rcli(s.ip(), "26379", "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "weir")
	if err != nil {
		return ""
	}
	return strings.Split(out, "\n")[0]
}

// sentinelConfig is weir's store section on the group.
func (g *sentinelGroup) sentinelConfig() string {
	var addrs []string
	for _, s := range g.sentAt {
		addrs = append(addrs, fmt.Sprintf("%q", s.ip()+":26379"))
	}
	return fmt.Sprintf("store:\n  type: redis\n  redis: {addrs: [%s], master_name: weir}\n  timeout: 50ms\n", strings.Join(addrs, ", "))
}

// load sends checks of rule for key to base every interval until stop
// closes, counting what it gets.
type tally struct {
	mu                          sync.Mutex
	allowed, refused, fallbacks int
	errs                        int
	firstErr                    error
	lastFallback                time.Time
}

func (y *tally) add(d decision, err error) {
	y.mu.Lock()
	defer y.mu.Unlock()
	switch {
	case err != nil:
		y.errs++
		if y.firstErr == nil {
			y.firstErr = err
		}
	case d.Fallback != "":
		y.fallbacks++
		y.lastFallback = time.Now()
		if d.Allowed {
			y.allowed++
		} else {
			y.refused++
		}
	case d.Allowed:
		y.allowed++
	default:
		y.refused++
	}
}

func (y *tally) get() (allowed, refused, fallbacks, errs int) {
	y.mu.Lock()
	defer y.mu.Unlock()
	return y.allowed, y.refused, y.fallbacks, y.errs
}

func drive(base, rule, key string, interval time.Duration, y *tally, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := &http.Client{Timeout: 5 * time.Second}
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				y.add(decide(c, base, rule, key))
			}
		}
	}()
}

// TestFaultSentinelFailover: a primary, a replica and three Sentinels, two
// weir instances with on_error deny under steady load on one 150/10m key;
// the test kills the primary's container (docker kill). Decisions resume on
// the promoted replica, and across the whole run the two instances admit at
// most the limit (in fact exactly it: no decision acknowledged by the old
// primary was lost here).
func TestFaultSentinelFailover(t *testing.T) {
	t.Parallel()
	n := newNet(t, "fo")
	g := startSentinelGroup(t, "fo", []fnet{n}, []fnet{n}, []fnet{n}, 1)
	config := g.sentinelConfig() + "rules:\n  - {name: fo, limit: 150/10m, algorithm: sliding_log, on_error: deny}\n"
	a := startWeirNode(t, "weir-"+runID+"-fo-a", config, []at{{n, 40}})
	b := startWeirNode(t, "weir-"+runID+"-fo-b", config, []at{{n, 41}})
	for _, w := range []weirNode{a, b} {
		waitFor(t, w.base+"/healthz/store", http.StatusOK)
	}

	var ya, yb tally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	drive(a.base, "fo", "k", 40*time.Millisecond, &ya, stop, &wg)
	drive(b.base, "fo", "k", 40*time.Millisecond, &yb, stop, &wg)
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})
	time.Sleep(1500 * time.Millisecond)
	before := func() int { a1, _, _, _ := ya.get(); a2, _, _, _ := yb.get(); return a1 + a2 }()
	if before == 0 || before >= 150 {
		t.Fatalf("%d admitted before the kill; want some, under the limit", before)
	}
	old := g.primaryAt.ip()
	docker(t, "kill", g.primary)

	// The Sentinels promote the replica; both instances decide with Redis
	// again (a decision without fallback after the last fallback).
	promoted := within(t, 60*time.Second, "a Sentinel naming a new primary", func() bool {
		m := g.master(g.sentAt[0])
		return m != "" && m != old
	})
	resumed := within(t, 60*time.Second, "both instances deciding on the new primary", func() bool {
		da, err1 := decide(http.DefaultClient, a.base, "fo", "probe")
		db, err2 := decide(http.DefaultClient, b.base, "fo", "probe")
		return err1 == nil && err2 == nil && da.Fallback == "" && db.Fallback == ""
	}) + promoted
	_, _, fa, _ := ya.get()
	_, _, fb, _ := yb.get()
	// Run on until the key is spent.
	within(t, 60*time.Second, "the key to be spent", func() bool {
		d, err := decide(http.DefaultClient, a.base, "fo", "k")
		ya.add(d, err)
		return err == nil && d.Fallback == "" && !d.Allowed
	})
	close(stop)
	wg.Wait()
	aa, ra, _, ea := ya.get()
	ab, rb, _, eb := yb.get()
	t.Logf("measured: %d admitted before the kill; new primary named by a Sentinel %v after the kill, "+
		"both instances on it %v after the kill; fallback (deny) decisions during the failover: %d and %d; "+
		"admitted in all %d (a %d, b %d), refused %d; errors %d",
		before, promoted.Round(time.Millisecond), resumed.Round(time.Millisecond), fa, fb, aa+ab, aa, ab, ra+rb, ea+eb)
	if ea+eb != 0 {
		t.Errorf("%d client errors (%v, %v)", ea+eb, ya.firstErr, yb.firstErr)
	}
	if aa+ab > 150 {
		t.Errorf("admitted %d across the failover with on_error deny; the limit is 150", aa+ab)
	}
}

// TestFaultSplitBrain: a primary with two replicas and three Sentinels on
// two networks; the test partitions the primary and weir-A (network p)
// from the replicas, the Sentinels and weir-B (network q). The Sentinels
// promote a replica, weir-B decides there, and weir-A keeps deciding on
// the old primary: both sides admit on the same key in the same window.
// After the heal the old primary becomes a replica and what weir-A wrote
// to it is lost. With min-replicas-to-write 1 (min-replicas-max-lag 2) the
// old primary refuses writes once its replicas' acknowledgements stop, so
// weir-A falls back to on_error (deny) and the overshoot shrinks to what it
// admitted before that.
func TestFaultSplitBrain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, label string
		extra       []string
	}{
		{"async", "sba", nil},
		{"min-replicas-to-write", "sbm", []string{"--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			splitBrain(t, tc.label, tc.extra)
		})
	}
}

func splitBrain(t *testing.T, label string, extra []string) {
	const limit, pre = 100, 10
	p, q := newNet(t, label+"-p"), newNet(t, label+"-q")
	g := startSentinelGroup(t, label, []fnet{p, q}, []fnet{q, p}, []fnet{q, p}, 2, extra...)
	config := g.sentinelConfig() + fmt.Sprintf("rules:\n  - {name: sb, limit: %d/10m, algorithm: sliding_log, on_error: deny}\n", limit)
	a := startWeirNode(t, "weir-"+runID+"-"+label+"-a", config, []at{{p, 40}, {q, 40}})
	b := startWeirNode(t, "weir-"+runID+"-"+label+"-b", config, []at{{q, 41}, {p, 41}})
	for _, w := range []weirNode{a, b} {
		waitFor(t, w.base+"/healthz/store", http.StatusOK)
	}
	for i := range pre {
		if d := mustDecide(t, []weirNode{a, b}[i%2].base, "sb", "k"); !d.Allowed || d.Fallback != "" {
			t.Fatalf("before the partition: %+v", d)
		}
	}

	// The partition: side p holds the old primary and weir-A, side q the
	// rest. Each move is one docker network disconnect, made at once.
	type move struct {
		name string
		n    at
	}
	var moves []move
	moves = append(moves, move{g.primary, at{q, 20}}, move{a.name, at{q, 40}})
	for i, r := range g.replicas {
		moves = append(moves, move{r, at{p, 21 + i}})
	}
	for i, s := range g.sentinels {
		moves = append(moves, move{s, at{p, 30 + i}})
	}
	moves = append(moves, move{b.name, at{p, 41}})
	parallel := func(f func(m move)) {
		var wg sync.WaitGroup
		for _, m := range moves {
			wg.Add(1)
			go func() { defer wg.Done(); f(m) }()
		}
		wg.Wait()
	}
	healed := false
	t.Cleanup(func() {
		if !healed {
			parallel(func(m move) {
				exec.Command("docker", "network", "connect", "--ip", m.n.ip(), m.n.net.name, m.name).Run()
			})
		}
	})
	parted := time.Now()
	parallel(func(m move) { cutOff(t, m.name, m.n) })
	partitioning := time.Since(parted)

	var ya, yb tally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	drive(a.base, "sb", "k", 100*time.Millisecond, &ya, stop, &wg)
	drive(b.base, "sb", "k", 100*time.Millisecond, &yb, stop, &wg)
	// A key each side writes alone: after the heal, weir-A's is gone and
	// weir-B's is there.
	aOnly := 0
	for range 5 {
		if d := mustDecide(t, a.base, "sb", "a-only"); d.Allowed && d.Fallback == "" {
			aOnly++
		}
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	})
	promoted := within(t, 60*time.Second, "a Sentinel naming a new primary", func() bool {
		m := g.master(g.sentAt[0])
		return m != "" && m != g.primaryAt.ip()
	})
	newPrimary := g.master(g.sentAt[0])
	bBack := within(t, 60*time.Second, "weir-B deciding on the new primary", func() bool {
		d, err := decide(http.DefaultClient, b.base, "sb", "probe")
		return err == nil && d.Fallback == ""
	}) + promoted
	for range 5 {
		mustDecide(t, b.base, "sb", "b-only")
	}
	// The window: 20 s of the partition, long enough for either side to
	// spend what it sees of the limit at 10 decisions a second.
	time.Sleep(time.Until(parted.Add(20 * time.Second)))
	close(stop)
	wg.Wait()
	stopped = true
	aa, ra, fa, ea := ya.get()
	ab, rb, fb, eb := yb.get()

	parallel(func(m move) { heal(t, m.name, m.n) })
	healed = true
	demoted := within(t, 60*time.Second, "the old primary to become a replica", func() bool {
		out, err := rcli(g.primaryAt.ip(), "6379", "ROLE")
		return err == nil && strings.HasPrefix(out, "slave")
	})
	// weir-A is back on the new primary when it sees b-only's count.
	aBack := within(t, 60*time.Second, "weir-A deciding on the new primary", func() bool {
		d, err := decide(http.DefaultClient, a.base, "sb", "b-only")
		return err == nil && d.Fallback == "" && d.Remaining < limit-5
	})
	d := mustDecide(t, b.base, "sb", "a-only")
	total := pre + aa + ab
	t.Logf("measured (%s): partition made in %v; new primary %s named %v after it, weir-B on it after %v; "+
		"in the 20 s window weir-A admitted %d (refused %d, %d by its deny fallback), weir-B admitted %d (refused %d, %d by fallback); "+
		"%d admitted before: %d in all on a limit of %d, overshoot %d; after the heal the old primary was a replica in %v "+
		"and weir-A on the new primary in %v; weir-A's %d admissions on a-only lost: %v (remaining %d)",
		label, partitioning.Round(time.Millisecond), newPrimary, promoted.Round(time.Millisecond), bBack.Round(time.Millisecond),
		aa, ra, fa, ab, rb, fb, pre, total, limit, max(total-limit, 0), demoted.Round(time.Millisecond), aBack.Round(time.Millisecond),
		aOnly, d.Remaining == limit-1, d.Remaining)
	if ea+eb != 0 {
		t.Errorf("%d client errors (%v, %v)", ea+eb, ya.firstErr, yb.firstErr)
	}
	if total > 2*limit {
		t.Errorf("%d admitted in one window on two sides; the bound is limit × sides = %d", total, 2*limit)
	}
	if d.Remaining != limit-1 {
		t.Errorf("a-only on the new primary after the heal: remaining %d; want %d (weir-A's writes to the old primary lost)", d.Remaining, limit-1)
	}
	if extra == nil {
		if aOnly == 0 || total <= limit {
			t.Errorf("the old primary took no writes from weir-A (a-only %d, admitted %d in all): no split brain to measure", aOnly, total)
		}
	} else {
		if fa == 0 {
			t.Error("weir-A never fell back: the old primary kept taking writes despite min-replicas-to-write")
		}
		if aa >= limit-pre {
			t.Errorf("weir-A admitted %d on the old primary; min-replicas-to-write should have stopped it short of %d", aa, limit-pre)
		}
	}
}

// TestFaultRollingRestart: nginx in front of three weir instances sharing
// one Redis, asking them about every request (auth_request) and passing a
// request to the next instance on a connection error; under steady load the
// test restarts each instance in turn (docker stop, which drains for
// --shutdown-delay, then docker start). No client sees an error (nothing but
// 200 and 429), each key admits exactly its limit over the run, and every
// instance decides again after its restart.
func TestFaultRollingRestart(t *testing.T) {
	t.Parallel()
	const limit, keys = 150, 8
	n := newNet(t, "roll")
	redis := "weir-" + runID + "-roll-redis"
	startRedis(t, redis, []at{{n, 10}})
	config := fmt.Sprintf(`store:
  type: redis
  redis: {addrs: ["%s:6379"]}
server:
  auth_headers: original
rules:
  - {name: roll, match: {path: /}, identity: [header:X-Key], limit: %d/10m, algorithm: sliding_log, on_error: allow}
`, n.ip(10), limit)
	var nodes []weirNode
	for i := 1; i <= 3; i++ {
		nodes = append(nodes, startWeirNode(t, fmt.Sprintf("weir-%s-roll-%d", runID, i), config, []at{{n, 10 + i}}, "--shutdown-delay", "2s"))
	}

	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	conf := filepath.Join(dir, "nginx.conf")
	nginxConf := fmt.Sprintf(`daemon off;
pid /tmp/nginx.pid;
error_log stderr warn;
worker_processes 1;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path /tmp/client_body;
    proxy_temp_path /tmp/proxy;
    fastcgi_temp_path /tmp/fastcgi;
    uwsgi_temp_path /tmp/uwsgi;
    scgi_temp_path /tmp/scgi;
    upstream weir {
        server %s:8080 max_fails=1 fail_timeout=2s;
        server %s:8080 max_fails=1 fail_timeout=2s;
        server %s:8080 max_fails=1 fail_timeout=2s;
    }
    server {
        listen 8000;
        location / {
            auth_request /_weir;
            error_page 403 = @limited;
            proxy_pass http://127.0.0.1:8001;
        }
        location = /_weir {
            internal;
            proxy_pass http://weir/v1/auth;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Original-Host $host;
            proxy_next_upstream error timeout;
            proxy_connect_timeout 300ms;
            proxy_read_timeout 5s;
        }
        location @limited {
            return 429 "limited\n";
        }
    }
    server {
        listen 127.0.0.1:8001;
        location / { return 200 "ok\n"; }
    }
}
`, n.ip(11), n.ip(12), n.ip(13))
	if err := os.WriteFile(conf, []byte(nginxConf), 0o644); err != nil {
		t.Fatal(err)
	}
	startContainer(t, "weir-"+runID+"-roll-nginx", []at{{n, 5}},
		[]string{"--read-only", "--tmpfs", "/tmp", "-v", conf + ":/etc/nginx/nginx.conf:ro"}, "weir-demo-nginx:"+tag)
	front := "http://" + n.ip(5) + ":8000"
	waitFor(t, front+"/", http.StatusOK)

	// The load: 4 clients, each a request every 10ms, on 8 keys in turn.
	var mu sync.Mutex
	admitted, sent := map[string]int{}, map[string]int{}
	var bad []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d", (w+i)%keys)
				req, _ := http.NewRequest(http.MethodGet, front+"/api", nil)
				req.Header.Set("X-Key", key)
				resp, err := c.Do(req)
				status := 0
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				sent[key]++
				switch {
				case err != nil:
					bad = append(bad, err.Error())
				case status == http.StatusOK:
					admitted[key]++
				case status != http.StatusTooManyRequests:
					bad = append(bad, resp.Status)
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	})
	start := time.Now()
	time.Sleep(2 * time.Second)
	var restarts []string
	for _, w := range nodes {
		s := time.Now()
		docker(t, "stop", "-t", "30", w.name)
		stopTook := time.Since(s)
		docker(t, "start", w.name)
		waitFor(t, w.base+"/readyz", http.StatusOK)
		restarts = append(restarts, fmt.Sprintf("%s stop %v, back %v", w.name, stopTook.Round(time.Millisecond), time.Since(s).Round(time.Millisecond)))
		time.Sleep(time.Second)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	stopped = true
	run := time.Since(start)

	total := 0
	for _, k := range sent {
		total += k
	}
	t.Logf("measured: %d requests in %v (%.0f/s) through nginx while %s; %d client errors; admitted per key %v of sent %v",
		total, run.Round(time.Millisecond), float64(total)/run.Seconds(), strings.Join(restarts, "; "), len(bad), admitted, sent)
	if len(bad) > 0 {
		t.Errorf("%d client-visible errors; the first: %s", len(bad), bad[0])
	}
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		if sent[key] <= limit || admitted[key] != limit {
			t.Errorf("key %s: %d admitted of %d sent; want exactly %d", key, admitted[key], sent[key], limit)
		}
	}
	for _, w := range nodes {
		if d := metric(t, w.base, "weir_decisions_total", `rule="roll"`); d == 0 {
			t.Errorf("%s decided nothing after its restart", w.name)
		}
	}
}

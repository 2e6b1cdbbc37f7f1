package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *syncBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.b.String(), s)
}

// writeFile replaces path's content atomically, as a deploy tool would.
func writeFile(t testing.TB, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func ruleNamesOf(s *Server) []string {
	var out []string
	for _, r := range s.Policy().Rules() {
		out = append(out, r.Name)
	}
	return out
}

// TestReloadEmptyFileRefused: a file caught mid-rewrite (empty) is refused
// by Server.Reload (SIGHUP) with an error that says why, and the rules in
// force stay; rules: [] is taken. A server does not start on an empty file.
func TestReloadEmptyFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weir.yaml")
	writeFile(t, path, testConfig)
	s, err := New(WithConfigFile(path), WithLogger(quietLogger()), WithAdminToken(""), WithGRPCAddr("off"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, doc := range []string{"", "\n\n", "# rewritten by the deploy\n"} {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		err := s.Reload()
		if err == nil || !strings.Contains(err.Error(), "empty") || !strings.Contains(err.Error(), "rules: []") {
			t.Fatalf("%q: Reload = %v, want a refusal saying the file is empty", doc, err)
		}
		if got := ruleNamesOf(s); len(got) != 4 {
			t.Fatalf("%q: rules in force after the refused reload: %v", doc, got)
		}
	}
	writeFile(t, path, "rules: []\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := ruleNamesOf(s); len(got) != 0 {
		t.Fatalf("rules: [] left %v", got)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	writeFile(t, empty, "")
	if _, err := New(WithConfigFile(empty), WithLogger(quietLogger())); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("New on an empty file: %v", err)
	}
}

// TestRulesFileAndReplacementInterleaved: file reloads and rule-set
// replacements run at once, each from its own goroutine. Each owns one
// part of the policy (the file its allow list, the replacement the rules),
// so once either's change returns, every policy put in force after it must
// hold that change. Without a lock around build and swap shared by both
// paths, one built from the other's old state and swapped last, and the
// change was lost.
func TestRulesFileAndReplacementInterleaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weir.yaml")
	fileDoc := func(i int) string {
		return fmt.Sprintf("allow: [198.51.100.%d/32]\nrules:\n  - {name: file, limit: 5/m}\n", i)
	}
	writeFile(t, path, fileDoc(0))
	s, err := New(WithConfigFile(path), WithLogger(quietLogger()), WithAdminToken(""), WithGRPCAddr("off"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 150
	var (
		mu       sync.Mutex
		lastFile = -1 // the last file change that returned
		lastRule = -1 // the last replacement that returned
		failures []string
	)
	// holds checks the policy in force against every change that returned:
	// it holds that change or a later one.
	holds := func(who string) {
		mu.Lock()
		f, r := lastFile, lastRule
		mu.Unlock()
		cfg := s.Policy().Config()
		fail := func(format string, args ...any) {
			mu.Lock()
			failures = append(failures, who+": "+fmt.Sprintf(format, args...))
			mu.Unlock()
		}
		if f >= 0 {
			var got int
			if len(cfg.Allow) != 1 {
				fail("the allow list in force is %v", cfg.Allow)
			} else if _, err := fmt.Sscanf(cfg.Allow[0], "198.51.100.%d/32", &got); err != nil || got < f {
				fail("file change %d returned, but the allow list in force is %v", f, cfg.Allow)
			}
		}
		if r >= 0 {
			var got int
			if len(cfg.Rules) != 1 {
				fail("the rules in force are %v", cfg.Rules)
			} else if _, err := fmt.Sscanf(cfg.Rules[0].Name, "r%d", &got); err != nil || got < r {
				fail("replacement %d returned, but the rule in force is %s", r, cfg.Rules[0].Name)
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 1; i <= n; i++ {
			writeFile(t, path, fileDoc(i))
			if err := s.Reload(); err != nil {
				t.Errorf("Reload: %v", err)
				return
			}
			mu.Lock()
			lastFile = i
			mu.Unlock()
			holds("after a file reload")
		}
	}()
	go func() {
		defer wg.Done()
		for j := 0; j < n; j++ {
			raw := []byte(fmt.Sprintf("rules:\n  - {name: r%d, limit: 9/m}\n", j))
			cfg, present, err := parseReplacement(raw)
			if err != nil {
				t.Errorf("replacement: %v", err)
				return
			}
			if _, err := s.applyRules(raw, cfg, present, ""); err != nil {
				t.Errorf("applyRules: %v", err)
				return
			}
			mu.Lock()
			lastRule = j
			mu.Unlock()
			holds("after a replacement")
		}
	}()
	wg.Wait()
	holds("at the end")
	if len(failures) > 0 {
		t.Fatalf("%d lost updates, the first: %s", len(failures), failures[0])
	}
}

// TestRedisRulesVersionNeverRepeats: after Redis loses its data, a new
// replacement must reach an instance that still has the old one in force,
// though a counter would have given it the same version again.
func TestRedisRulesVersionNeverRepeats(t *testing.T) {
	r := redistest.Standalone(t)
	logs := &syncBuffer{}
	slow := func(o *options) { o.rulesEvery = time.Hour } // a polls when the test says
	a, _ := newRedisServer(t, r.Addr, "a", slow, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	_, baseB := newRedisServer(t, r.Addr, "b")
	put := func(rule string) string {
		t.Helper()
		resp, body := call(t, "PUT", baseB+"/v1/rules", "rules:\n  - {name: "+rule+", limit: 3/m}\n", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("PUT: %d %s", resp.StatusCode, body)
		}
		return fmt.Sprint(decode(t, body)["version"])
	}
	poll := func() {
		t.Helper()
		if err := a.rules.poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	v1 := put("first")
	poll()
	if got := ruleNamesOf(a); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("a has %v, want the first replacement", got)
	}
	// Redis loses everything before a polls again; b stores new rules.
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	v2 := put("second")
	poll()
	if got := ruleNamesOf(a); !slices.Equal(got, []string{"second"}) {
		t.Fatalf("after Redis lost its data and b stored new rules (version %s, the first's was %s), a has %v", v2, v1, got)
	}
	// Only the version key is lost: the rules stored are those in force,
	// and a neither drops nor re-applies them on every poll.
	changes := logs.count("rules changed by another instance")
	if _, err := r.Do("DEL", keysFor("").rulesVersion); err != nil {
		t.Fatal(err)
	}
	poll()
	poll()
	if got := ruleNamesOf(a); !slices.Equal(got, []string{"second"}) || logs.count("rules changed by another instance") != changes {
		t.Fatalf("after the version key alone was lost, a has %v and logged %d changes more", got, logs.count("rules changed by another instance")-changes)
	}
	// The stored rules vanish: a goes back to its config and says so, once.
	if _, err := r.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	poll()
	poll()
	if got := ruleNamesOf(a); !slices.Contains(got, "login") || slices.Contains(got, "second") {
		t.Fatalf("the stored rules are gone, yet a has %v", got)
	}
	if n := logs.count("rules stored in Redis are gone"); n != 1 {
		t.Fatalf("the loss was logged %d times, want once:\n%s", n, logs.String())
	}
}

// TestRedisPrefixSeparatesDeployments: two deployments with their own
// store.redis.prefix on one Redis share no key: not the rules, not the
// penalty-box index, not the fleet view, not the limiter state.
func TestRedisPrefixSeparatesDeployments(t *testing.T) {
	r := redistest.Standalone(t)
	deploy := func(prefix, id string) (*Server, string) {
		cfg := mustParse(t, testConfig+"store:\n  timeout: 2s\n  redis:\n    prefix: "+prefix+"\n")
		return newRedisServer(t, r.Addr, id, WithConfig(cfg)) // --redis keeps the prefix
	}
	blue, baseBlue := deploy("blue", "blue-1")
	blue2, _ := deploy("blue", "blue-2")
	green, baseGreen := deploy("green", "green-1")

	// Rules: a PUT on blue reaches blue's other instance, not green.
	resp, body := call(t, "PUT", baseBlue+"/v1/rules", "rules:\n  - {name: bluerule, limit: 3/m}\n", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	eventually(t, 30*time.Second, "blue's second instance to pick the rules up", func() bool {
		return slices.Equal(ruleNamesOf(blue2), []string{"bluerule"})
	})
	time.Sleep(200 * time.Millisecond) // several of green's polls
	if got := ruleNamesOf(green); slices.Contains(got, "bluerule") || !slices.Contains(got, "login") {
		t.Fatalf("green's rules changed with blue's PUT: %v", got)
	}
	if resp, _ := call(t, "DELETE", baseBlue+"/v1/rules", "", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	eventually(t, 30*time.Second, "blue to restore its config", func() bool {
		return slices.Contains(ruleNamesOf(blue), "login") && slices.Contains(ruleNamesOf(blue2), "login")
	})

	// Limiter state and the penalty box: green blocks an identity; blue
	// neither counts it nor lists it.
	for range 5 {
		check(t, baseGreen, "login", "192.0.2.66", 1)
	}
	if _, d := check(t, baseBlue, "login", "192.0.2.66", 1); d["allowed"] != true {
		t.Fatalf("green's counter limited blue: %v", d)
	}
	blockedOn := func(base string) []BlockedEntry {
		_, body := call(t, "GET", base+"/v1/blocked", "", bearer(token)...)
		var list struct {
			Blocked []BlockedEntry `json:"blocked"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("blocked: %v %s", err, body)
		}
		return list.Blocked
	}
	eventually(t, 30*time.Second, "green to list its block", func() bool { return len(blockedOn(baseGreen)) == 1 })
	if got := blockedOn(baseBlue); len(got) != 0 {
		t.Fatalf("blue lists green's blocks: %+v", got)
	}

	// The fleet view: each deployment sees its own instances only.
	instances := func(base string) []string {
		_, body := call(t, "GET", base+"/v1/dashboard/snapshot", "")
		var snap Snapshot
		if err := json.Unmarshal(body, &snap); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		var ids []string
		for _, in := range snap.Instances {
			ids = append(ids, in.ID)
		}
		slices.Sort(ids)
		return ids
	}
	eventually(t, 30*time.Second, "blue's fleet view", func() bool {
		return slices.Equal(instances(baseBlue), []string{"blue-1", "blue-2"})
	})
	if got := instances(baseGreen); !slices.Equal(got, []string{"green-1"}) {
		t.Fatalf("green's fleet view: %v", got)
	}

	// Every key in Redis starts with one of the two prefixes.
	keys, err := r.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := keys.([]any)
	if len(list) == 0 {
		t.Fatal("no keys in Redis")
	}
	seen := map[string]bool{}
	for _, k := range list {
		name := fmt.Sprint(k)
		p, _, _ := strings.Cut(name, ":")
		if p != "blue" && p != "green" {
			t.Errorf("key %q has neither prefix", name)
		}
		seen[p] = true
	}
	if !seen["blue"] || !seen["green"] {
		t.Fatalf("keys of one deployment missing: %v", list)
	}
}

// TestRedisClusterPrefixAndRules: on a Redis Cluster the stored rules and
// their version may sit on different nodes; a replacement still reaches
// the deployment's other instance and not the other deployment, and every
// key on every node carries its deployment's prefix.
func TestRedisClusterPrefixAndRules(t *testing.T) {
	c := redistest.Cluster(t)
	deploy := func(prefix, id string) (*Server, string) {
		t.Helper()
		cfg := mustParse(t, testConfig+"store:\n  timeout: 2s\n  redis:\n    prefix: "+prefix+"\n")
		return newRedisServer(t, "", id, WithConfig(cfg), WithRedisURL(strings.Join(c.Addrs, ",")))
	}
	blue, baseBlue := deploy("blue", "blue-1")
	blue2, _ := deploy("blue", "blue-2")
	green, baseGreen := deploy("green", "green-1")
	if d := blue.StoreDescription(); !strings.Contains(d, "cluster") {
		t.Fatalf("store: %s", d)
	}
	resp, body := call(t, "PUT", baseBlue+"/v1/rules", "rules:\n  - {name: bluerule, limit: 3/m}\n", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d %s", resp.StatusCode, body)
	}
	eventually(t, 30*time.Second, "blue's second instance to pick the rules up", func() bool {
		return slices.Equal(ruleNamesOf(blue2), []string{"bluerule"})
	})
	check(t, baseGreen, "login", "192.0.2.1", 1)
	check(t, baseBlue, "bluerule", "k", 1)
	time.Sleep(200 * time.Millisecond)
	if got := ruleNamesOf(green); slices.Contains(got, "bluerule") {
		t.Fatalf("green's rules changed with blue's PUT: %v", got)
	}
	n := 0
	for _, node := range c.Nodes {
		keys, err := node.Do("KEYS", "*")
		if err != nil {
			t.Fatal(err)
		}
		list, _ := keys.([]any)
		for _, k := range list {
			n++
			if p, _, _ := strings.Cut(fmt.Sprint(k), ":"); p != "blue" && p != "green" {
				t.Errorf("key %q on %s has neither prefix", k, node.Addr)
			}
		}
	}
	if n == 0 {
		t.Fatal("no keys on the cluster")
	}
}

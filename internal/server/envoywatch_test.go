package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// envoyFile is a config file of one domain with one descriptor key "k".
func envoyFile(domain string, rpu int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: %d }\n", domain, rpu)
}

// envoyLimit is the requests_per_unit the server in force applies to
// domain's descriptor k, 0 if the domain is unknown.
func envoyLimit(t testing.TB, s *Server, domain string) uint32 {
	t.Helper()
	resp, err := s.Envoy().Check(context.Background(), &rlspb.RateLimitRequest{Domain: domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

func mustWrite(t testing.TB, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// swapLink points link at target atomically: a new symlink renamed over
// the old one, as Kubernetes and envoyproxy/ratelimit's runtime do.
func swapLink(t testing.TB, target, link string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

func newEnvoyDirServer(t *testing.T, dir string, logs *syncBuffer, opts ...Option) *Server {
	t.Helper()
	log := quietLogger()
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	s, _ := newTestServer(t, append([]Option{WithEnvoyConfigDir(dir), WithLogger(log)}, opts...)...)
	return s
}

const envoyWait = 10 * time.Second

// reloadCount reads weir_config_reloads_total{result}.
func reloadCount(t testing.TB, s *Server, result string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "weir_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no weir_config_reloads_total{result=%q}", result)
	return 0
}

// TestEnvoyDirWatchFiles: a file added, changed and removed is applied
// without SIGHUP; a bad file set is refused with its file:line, the last
// good config stays, and the stale gauge and /readyz say so until fixed.
func TestEnvoyDirWatchFiles(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "a.yaml"), envoyFile("a", 5))
	logs := &syncBuffer{}
	s := newEnvoyDirServer(t, dir, logs)
	if got := envoyLimit(t, s, "a"); got != 5 {
		t.Fatalf("initial limit %d, want 5", got)
	}

	mustWrite(t, filepath.Join(dir, "b.yaml"), envoyFile("b", 7))
	eventually(t, envoyWait, "b.yaml added", func() bool { return envoyLimit(t, s, "b") == 7 })

	writeFile(t, filepath.Join(dir, "a.yaml"), envoyFile("a", 6))
	eventually(t, envoyWait, "a.yaml changed", func() bool { return envoyLimit(t, s, "a") == 6 })

	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, envoyWait, "b.yaml removed", func() bool { return envoyLimit(t, s, "b") == 0 })

	// A bad file: refused with file:line; a still 6, b still absent.
	mustWrite(t, filepath.Join(dir, "c.yaml"), "domain: c\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n")
	eventually(t, envoyWait, "the bad file refused", func() bool { return s.envoyState.stale.Load() })
	if logs.count("c.yaml:4:") == 0 {
		t.Errorf("the refusal does not name c.yaml:4; logs:\n%s", logs.String())
	}
	if got := envoyLimit(t, s, "a"); got != 6 {
		t.Errorf("after a refused reload a's limit is %d, want the last good 6", got)
	}
	if got := reloadCount(t, s, "failure"); got < 1 {
		t.Errorf("reload failures = %v, want at least 1", got)
	}
	_, ts := newTestServer(t) // a server without an Envoy dir has no stale field
	_, body := call(t, "GET", ts.URL+"/readyz", "")
	if strings.Contains(string(body), "envoy_config_stale") {
		t.Errorf("/readyz without --envoy-config: %s", body)
	}
	rs := httptestServe(t, s)
	if _, body := call(t, "GET", rs+"/readyz", ""); !strings.Contains(string(body), `"envoy_config_stale":true`) {
		t.Errorf("/readyz while stale: %s", body)
	}

	writeFile(t, filepath.Join(dir, "c.yaml"), envoyFile("c", 3))
	eventually(t, envoyWait, "the fixed file applied", func() bool { return envoyLimit(t, s, "c") == 3 })
	if s.envoyState.stale.Load() {
		t.Error("still stale after a good reload")
	}
	if _, body := call(t, "GET", rs+"/readyz", ""); !strings.Contains(string(body), `"envoy_config_stale":false`) {
		t.Errorf("/readyz after the fix: %s", body)
	}
}

// httptestServe serves s's handler and returns its URL.
func httptestServe(t *testing.T, s *Server) string {
	t.Helper()
	url, _ := serveOn(t, s)
	return url
}

// TestEnvoyDirWatchConfigMapSwap: a Kubernetes ConfigMap volume ("..data"
// symlink to a timestamped directory, each file a symlink through it)
// updated by swapping "..data": the new file set is applied whole, and no
// call ever sees half of the old set and half of the new.
func TestEnvoyDirWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name string, v int) {
		mustWrite(t, filepath.Join(dir, name, "a.yaml"), envoyFile("a", 10+v))
		mustWrite(t, filepath.Join(dir, name, "b.yaml"), envoyFile("b", 20+v))
	}
	version("..2026_01_01_00_00_00.1", 1)
	if err := os.Symlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a.yaml", "b.yaml"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	s := newEnvoyDirServer(t, dir, nil)

	// A reader checks that every configuration it sees is one version.
	stop := make(chan struct{})
	var torn atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var rpu []uint32
			for _, r := range s.Envoy().Config().Rules() {
				rpu = append(rpu, r.RequestsPerUnit)
			}
			slices.Sort(rpu)
			if len(rpu) != 2 || rpu[1]-rpu[0] != 10 {
				torn.Add(1)
			}
		}
	}()
	for v := 2; v <= 4; v++ {
		name := fmt.Sprintf("..2026_01_01_00_00_00.%d", v)
		version(name, v)
		swapLink(t, name, filepath.Join(dir, "..data"))
		if err := os.RemoveAll(filepath.Join(dir, fmt.Sprintf("..2026_01_01_00_00_00.%d", v-1))); err != nil {
			t.Fatal(err)
		}
		eventually(t, envoyWait, fmt.Sprintf("version %d", v), func() bool {
			return envoyLimit(t, s, "a") == uint32(10+v) && envoyLimit(t, s, "b") == uint32(20+v)
		})
	}
	close(stop)
	wg.Wait()
	if torn.Load() > 0 {
		t.Fatalf("%d reads saw a mix of two file sets", torn.Load())
	}
}

// TestEnvoyDirWatchRuntimeRoot: envoyproxy/ratelimit's runtime layout,
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, whose root is a
// symlink swapped to a new directory (RUNTIME_WATCH_ROOT), and files
// changed in place in the directory it points to.
func TestEnvoyDirWatchRuntimeRoot(t *testing.T) {
	top := t.TempDir()
	mustWrite(t, filepath.Join(top, "v1", "ratelimit", "config", "a.yaml"), envoyFile("a", 1))
	mustWrite(t, filepath.Join(top, "v2", "ratelimit", "config", "a.yaml"), envoyFile("a", 2))
	mustWrite(t, filepath.Join(top, "v2", "ratelimit", "config", "b.yaml"), envoyFile("b", 2))
	if err := os.Symlink("v1", filepath.Join(top, "current")); err != nil {
		t.Fatal(err)
	}
	s := newEnvoyDirServer(t, filepath.Join(top, "current", "ratelimit", "config"), nil)
	if got := envoyLimit(t, s, "a"); got != 1 {
		t.Fatalf("initial limit %d, want 1", got)
	}
	swapLink(t, "v2", filepath.Join(top, "current"))
	eventually(t, envoyWait, "the root swapped to v2", func() bool {
		return envoyLimit(t, s, "a") == 2 && envoyLimit(t, s, "b") == 2
	})
	// Now v2's directory is the one watched: a file written there in place.
	writeFile(t, filepath.Join(top, "v2", "ratelimit", "config", "a.yaml"), envoyFile("a", 3))
	eventually(t, envoyWait, "a file changed under the new root", func() bool { return envoyLimit(t, s, "a") == 3 })
}

// TestEnvoyDirWatchDebounce: a burst of writes is applied as its last
// state, in fewer reloads than writes, and a write that changes nothing
// reloads nothing.
func TestEnvoyDirWatchDebounce(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "a.yaml"), envoyFile("a", 1))
	s := newEnvoyDirServer(t, dir, nil)
	ok := func() float64 { return reloadCount(t, s, "success") }
	const writes = 50
	for i := 2; i <= writes+1; i++ {
		writeFile(t, filepath.Join(dir, "a.yaml"), envoyFile("a", i))
	}
	eventually(t, envoyWait, "the burst's last write", func() bool { return envoyLimit(t, s, "a") == writes+1 })
	if n := ok(); n >= writes/2 {
		t.Errorf("%d writes made %v reloads; want them debounced", writes, n)
	}
	before := ok()
	writeFile(t, filepath.Join(dir, "a.yaml"), envoyFile("a", writes+1)) // the same content
	writeFile(t, filepath.Join(dir, "b.yaml"), envoyFile("b", 9))
	eventually(t, envoyWait, "b.yaml added", func() bool { return envoyLimit(t, s, "b") == 9 })
	if got := ok() - before; got != 1 {
		t.Errorf("an unchanged file and a new one made %v reloads, want 1", got)
	}
}

// TestEnvoySettingsServe: the global settings reach the served service,
// and the unknown-domain counter is exported without the domain.
func TestEnvoySettingsServe(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "1.yaml"), envoyFile("m", 1))
	mustWrite(t, filepath.Join(dir, "2.yaml"), "domain: m\ndescriptors:\n  - key: j\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n")
	if _, err := New(WithConfig(mustParse(t, testConfig)), WithEnvoyConfigDir(dir), WithLogger(quietLogger())); err == nil ||
		!strings.Contains(err.Error(), `domain "m" is already defined`) {
		t.Fatalf("two files of one domain without merging: err = %v", err)
	}
	s := newEnvoyDirServer(t, dir, nil, WithEnvoySettings(EnvoySettings{ShadowMode: true, ResponseHeaders: true, MergeDomains: true}))
	req := &rlspb.RateLimitRequest{Domain: "m", HitsAddend: 2,
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	resp, err := s.Envoy().Check(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].Code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("shadow mode: overall %v, status %v; want OK and OVER_LIMIT", resp.OverallCode, resp.Statuses[0].Code)
	}
	if len(resp.ResponseHeadersToAdd) != 3 {
		t.Errorf("response headers: %v", resp.ResponseHeadersToAdd)
	}
	if _, err := s.Envoy().Check(context.Background(), &rlspb.RateLimitRequest{Domain: "secret-tenant-x", Descriptors: req.Descriptors}); err != nil {
		t.Fatal(err)
	}
	url := httptestServe(t, s)
	_, body := call(t, "GET", url+"/metrics", "")
	for _, want := range []string{"weir_envoy_unknown_domain_total 1", "weir_envoy_shadow_mode_total 1", "weir_envoy_config_stale 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), "secret-tenant-x") {
		t.Error("/metrics names a domain from a request")
	}
}

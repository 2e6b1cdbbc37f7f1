package policy

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
)

const (
	confV1  = "rules:\n  - {name: a, identity: const:x, limit: 3/h, algorithm: fixed_window}\n"
	confV2  = "rules:\n  - {name: a, identity: const:x, limit: 3/h, algorithm: fixed_window}\n  - {name: b, identity: const:x, limit: 9/h}\n"
	confV3  = "rules:\n  - {name: a, identity: const:x, limit: 3/h, algorithm: fixed_window}\n  - {name: c, identity: const:x, limit: 9/h}\n"
	confBad = "rules:\n  - {name: a, identity: const:x, limit: 3/hh}\n  - {name: a, limit: 1/m}\n"
)

// watched starts Watch on path with a shared guard and records swaps.
type watched struct {
	h     *Holder
	guard *guard.Guard
	mu    sync.Mutex
	swaps []error // nil for a success
	logs  *countingHandler
}

func (w *watched) swapCount() (ok, failed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.swaps {
		if e == nil {
			ok++
		} else {
			failed++
		}
	}
	return ok, failed
}

func startWatch(t *testing.T, path string, opts ...WatchOption) *watched {
	t.Helper()
	w := &watched{logs: &countingHandler{}}
	w.guard = guard.New(memstore.New(), guard.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	opts = append([]WatchOption{WatchLogger(slog.New(w.logs)), WatchDebounce(20 * time.Millisecond)}, opts...)
	h, err := Watch(ctx, path, func(c *config.Config) (*Policy, error) { return New(c, w.guard) },
		func(old, new *Policy, err error) {
			if old == nil || (err == nil) == (new == nil) {
				t.Errorf("onSwap(%p, %p, %v)", old, new, err)
			}
			w.mu.Lock()
			w.swaps = append(w.swaps, err)
			w.mu.Unlock()
		}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	w.h = h
	return w
}

func ruleNames(p *Policy) []string {
	var out []string
	for _, r := range p.Rules() {
		out = append(out, r.Name)
	}
	return out
}

func hasRule(h *Holder, name string) bool {
	for _, n := range ruleNames(h.Load()) {
		if n == name {
			return true
		}
	}
	return false
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	w := startWatch(t, path)
	if got := ruleNames(w.h.Load()); len(got) != 1 {
		t.Fatalf("first load: %v", got)
	}
	// Counters of an unchanged rule survive the reload.
	for i := 0; i < 2; i++ {
		if !w.h.Load().Check(ctx, req("GET", "/")).Allowed {
			t.Fatal("rejected")
		}
	}
	write(t, path, confV2)
	waitFor(t, 10*time.Second, "the rewritten file to be loaded", func() bool {
		ok, _ := w.swapCount()
		return hasRule(w.h, "b") && ok == 1
	})
	v := w.h.Load().Check(ctx, req("GET", "/"))
	if !v.Allowed || v.Results[0].Rule != "a" || v.Results[0].Result.Remaining != 0 {
		t.Fatalf("after the reload, rule a: %+v", v.Results[0])
	}
	if v := w.h.Load().Check(ctx, req("GET", "/")); v.Allowed {
		t.Fatal("the reload reset rule a's counter")
	}
	if w.h.ReloadsOK() != 1 || w.h.ReloadsFailed() != 0 {
		t.Fatalf("counters %d/%d", w.h.ReloadsOK(), w.h.ReloadsFailed())
	}
	// Touching the file without changing it reloads nothing.
	now := time.Now().Add(time.Second)
	if err := os.Chtimes(path, now, now); err != nil {
		t.Fatal(err)
	}
	write(t, path, confV2)
	write(t, path, confV3)
	waitFor(t, 10*time.Second, "the third version", func() bool {
		ok, _ := w.swapCount()
		return hasRule(w.h, "c") && ok == 2
	})
	if ok, failed := w.swapCount(); ok != 2 || failed != 0 || w.h.ReloadsOK() != 2 {
		t.Fatalf("%d swaps (%d failed), %d reloads counted; want 2", ok, failed, w.h.ReloadsOK())
	}
}

// TestWatchRename: editors write a new file and rename it over the old.
func TestWatchRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	w := startWatch(t, path)
	tmp := filepath.Join(dir, ".weir.yaml.swp")
	write(t, tmp, confV2)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the renamed file to be loaded", func() bool { return hasRule(w.h, "b") })
	// And again, to show the watch survives the inode change.
	write(t, tmp, confV3)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the second rename", func() bool { return hasRule(w.h, "c") })
}

// TestWatchKubernetes replays a ConfigMap update: the file is a symlink
// through "..data", which is swapped atomically to a new directory.
func TestWatchKubernetes(t *testing.T) {
	dir := t.TempDir()
	mk := func(ts, content string) {
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, ts, "weir.yaml"), content)
	}
	mk("..2030_01_01_00_00_00.1", confV1)
	if err := os.Symlink("..2030_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/weir.yaml", filepath.Join(dir, "weir.yaml")); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, filepath.Join(dir, "weir.yaml"))
	swap := func(ts, content, old string) {
		mk(ts, content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(ts, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
	swap("..2030_01_01_00_01_00.2", confV2, "..2030_01_01_00_00_00.1")
	waitFor(t, 10*time.Second, "the ConfigMap update to be loaded", func() bool { return hasRule(w.h, "b") })
	swap("..2030_01_01_00_02_00.3", confV3, "..2030_01_01_00_01_00.2")
	waitFor(t, 10*time.Second, "the second ConfigMap update", func() bool { return hasRule(w.h, "c") })
}

// TestWatchBadFile: a bad file is rejected, logged and counted; the old
// rules stay in force until a good file arrives.
func TestWatchBadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	w := startWatch(t, path)
	before := w.h.Load()
	write(t, path, confBad)
	waitFor(t, 10*time.Second, "the bad file to be rejected", func() bool {
		_, failed := w.swapCount()
		return w.h.ReloadsFailed() == 1 && failed == 1
	})
	if w.h.Load() != before {
		t.Fatal("a bad file replaced the policy")
	}
	if _, failed := w.swapCount(); failed != 1 {
		t.Fatalf("%d failed swaps reported", failed)
	}
	w.mu.Lock()
	var ce *config.Error
	if !errors.As(w.swaps[0], &ce) || len(ce.Problems) != 2 {
		t.Fatalf("onSwap error: %v", w.swaps[0])
	}
	w.mu.Unlock()
	if w.logs.Count("weir: config problem") != 2 || w.logs.Count("weir: config rejected; the old rules stay in force") != 1 {
		t.Fatalf("logs: %d problems, %d rejections", w.logs.Count("weir: config problem"), w.logs.Count("weir: config rejected; the old rules stay in force"))
	}
	write(t, path, confV2)
	waitFor(t, 10*time.Second, "the fixed file", func() bool {
		ok, _ := w.swapCount()
		return hasRule(w.h, "b") && ok == 1
	})
	if w.h.ReloadsOK() != 1 || w.h.ReloadsFailed() != 1 {
		t.Fatalf("counters %d/%d", w.h.ReloadsOK(), w.h.ReloadsFailed())
	}
}

// TestReloadOnSIGHUP installs the handler, then signals this process.
func TestReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	// A debounce of an hour keeps fsnotify out of it: only the signal reloads.
	w := startWatch(t, path, WatchDebounce(time.Hour))
	stop := w.h.ReloadOnSignal(context.Background(), syscall.SIGHUP)
	defer stop()
	write(t, path, confV2)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "SIGHUP to reload", func() bool { return hasRule(w.h, "b") })
	// A SIGHUP with a bad file keeps the rules.
	write(t, path, confBad)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the bad reload", func() bool { return w.h.ReloadsFailed() == 1 })
	if !hasRule(w.h, "b") {
		t.Fatal("a bad file replaced the rules")
	}
	if err := w.h.Reload(); err == nil {
		t.Fatal("Reload of a bad file succeeded")
	}
}

func TestHolderSwap(t *testing.T) {
	p1 := mustPolicy(t, confV1, nil)
	p2 := mustPolicy(t, confV2, nil)
	h := NewHolder(p1)
	if h.Load() != p1 {
		t.Fatal("Load")
	}
	if old := h.Swap(p2); old != p1 || h.Load() != p2 || h.ReloadsOK() != 1 {
		t.Fatal("Swap")
	}
	if err := h.Reload(); err == nil {
		t.Fatal("Reload without a file succeeded")
	}
}

func TestWatchFirstLoadFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confBad)
	var ce *config.Error
	if _, err := Watch(context.Background(), path, nil, nil); !errors.As(err, &ce) {
		t.Fatalf("got %v", err)
	}
	if _, err := Watch(context.Background(), filepath.Join(dir, "missing.yaml"), nil, nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v", err)
	}
}

// TestWatchNilBuild: without a build function, reloads still share one
// store, so counters survive them.
func TestWatchNilBuild(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h, err := Watch(ctx, path, nil, nil, WatchLogger(slog.New(&countingHandler{})), WatchDebounce(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		h.Load().Check(ctx, req("GET", "/"))
	}
	write(t, path, confV2)
	waitFor(t, 10*time.Second, "the reload", func() bool { return hasRule(h, "b") })
	if v := h.Load().Check(ctx, req("GET", "/")); v.Allowed {
		t.Fatal("the reload reset rule a's counter")
	}
}

// churn rewrites a file every millisecond or so, through fn, until the test
// ends.
func churn(t *testing.T, fn func(i int)) {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			fn(i)
			time.Sleep(time.Millisecond)
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// TestWatchNeighbourChurn: a file next to the config, written all the
// time (a log, a lock, another app's state), must not hold a change of the
// config back. It used to restart the debounce on every event in the
// directory, so the config was never reloaded.
func TestWatchNeighbourChurn(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	// No maximum wait to speak of: only the filtering of events can let
	// the reload through.
	w := startWatch(t, path, WatchDebounce(2*time.Second), WatchMaxWait(time.Hour))
	neighbour := filepath.Join(dir, "app.log")
	churn(t, func(i int) { _ = os.WriteFile(neighbour, []byte(strconv.Itoa(i)), 0o644) })
	time.Sleep(50 * time.Millisecond) // the churn is under way
	write(t, path, confV2)
	waitFor(t, 20*time.Second, "the config to be reloaded next to a busy file", func() bool { return hasRule(w.h, "b") })
}

// TestWatchMaxWait: a config file that never goes quiet (rewritten every
// millisecond or so) is still reloaded, within the maximum wait.
func TestWatchMaxWait(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV1)
	w := startWatch(t, path, WatchDebounce(2*time.Second), WatchMaxWait(3*time.Second))
	tmp := filepath.Join(dir, ".weir.yaml.tmp")
	churn(t, func(i int) {
		// Atomic rewrites, each a little different.
		if os.WriteFile(tmp, []byte(confV2+"# "+strconv.Itoa(i)+"\n"), 0o644) == nil {
			_ = os.Rename(tmp, path)
		}
	})
	waitFor(t, 20*time.Second, "a config rewritten without pause to be reloaded", func() bool { return hasRule(w.h, "b") })
}

// TestWatchChain: the events that concern a config are those on the file,
// on the symlinks it goes through, and on their targets.
func TestWatchChain(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "..2030_01_01"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "..2030_01_01", "weir.yaml"), confV1)
	if err := os.Symlink("..2030_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "weir.yaml")
	if err := os.Symlink("..data/weir.yaml", path); err != nil {
		t.Fatal(err)
	}
	c := configChain(path)
	for _, name := range []string{path, filepath.Join(dir, "..data"), filepath.Join(dir, "..2030_01_01"), filepath.Join(dir, "..data", "weir.yaml")} {
		if !c.concerns(name) {
			t.Errorf("%s does not concern %v", name, c)
		}
	}
	for _, name := range []string{filepath.Join(dir, "app.log"), filepath.Join(dir, "weir.yaml.bak"), filepath.Join(dir, "..2030_01_01", "other.yaml")} {
		if c.concerns(name) {
			t.Errorf("%s concerns %v", name, c)
		}
	}
}

// TestReloadRefusesEmpty: Reload (SIGHUP) of a file caught mid-rewrite,
// empty, leaves the rules in force and says why; rules: [] is taken.
func TestReloadRefusesEmpty(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write(t, path, confV2)
	w := startWatch(t, path, WatchDebounce(time.Hour))
	for _, doc := range []string{"", "\n  \n", "# being rewritten\n"} {
		write(t, path, doc)
		err := w.h.Reload()
		if err == nil || !strings.Contains(err.Error(), "empty") {
			t.Fatalf("%q: Reload = %v, want an error saying the file is empty", doc, err)
		}
		if got := ruleNames(w.h.Load()); len(got) != 2 {
			t.Fatalf("%q: the rules in force are now %v", doc, got)
		}
	}
	write(t, path, "rules: []\n")
	if err := w.h.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := ruleNames(w.h.Load()); len(got) != 0 {
		t.Fatalf("rules: [] left %v in force", got)
	}
	// And a file that is empty at the start is refused too.
	empty := filepath.Join(dir, "empty.yaml")
	write(t, empty, "")
	if _, err := Watch(context.Background(), empty, nil, nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("Watch of an empty file: %v", err)
	}
}

package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/weir-dev/weir/store/memstore"
)

// Holder holds the Policy in force and swaps it atomically: requests call
// Load, and reloads (of the file, on SIGHUP, or from the admin API through
// Swap) replace it without a restart. A request that loaded the old policy
// finishes under it.
type Holder struct {
	p atomic.Pointer[Policy]

	path   string
	build  func(*Config) (*Policy, error)
	onSwap func(old, new *Policy, err error)
	log    *slog.Logger

	mu      sync.Mutex // serializes reloads
	lastSum [sha256.Size]byte

	ok, failed atomic.Uint64
}

// NewHolder returns a Holder of p, for rule sets that do not come from a
// file (Swap replaces them).
func NewHolder(p *Policy) *Holder {
	h := &Holder{log: slog.Default()}
	h.p.Store(p)
	return h
}

// Load returns the policy in force.
func (h *Holder) Load() *Policy { return h.p.Load() }

// Swap puts p in force and returns the policy it replaces. It reports the
// swap to the Watch callback, if any, and counts it as a successful reload.
func (h *Holder) Swap(p *Policy) (old *Policy) {
	old = h.p.Swap(p)
	h.ok.Add(1)
	if h.onSwap != nil {
		h.onSwap(old, p, nil)
	}
	return old
}

// ReloadsOK returns how many reloads and swaps succeeded.
func (h *Holder) ReloadsOK() uint64 { return h.ok.Load() }

// ReloadsFailed returns how many reloads were rejected, leaving the old
// rules in force.
func (h *Holder) ReloadsFailed() uint64 { return h.failed.Load() }

// A WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	log      *slog.Logger
	debounce time.Duration
}

// WatchLogger sets the logger of reloads (default slog.Default()).
func WatchLogger(l *slog.Logger) WatchOption { return func(o *watchOptions) { o.log = l } }

// WatchDebounce sets how long the file must stay quiet after a change
// before it is reloaded (default 100ms), so that an editor's several
// writes make one reload.
func WatchDebounce(d time.Duration) WatchOption { return func(o *watchOptions) { o.debounce = d } }

// Watch loads the config file at path, builds the first Policy with build,
// and keeps it up to date until ctx ends: whenever the file changes, it is
// parsed and built again and, if that succeeds, swapped in.
//
// Watch watches the file's directory rather than the file, so it sees
// editors that write a new file and rename it over the old one, and the
// Kubernetes ConfigMap update, which swaps a "..data" symlink. A change
// that leaves the content identical is ignored.
//
// A bad new file is rejected: its problems are logged, ReloadsFailed
// counts it, and the old policy stays in force. An empty file is taken for
// one caught mid-write and ignored (Reload loads it). onSwap, if not nil, is
// called after every reload attempt with the old and new policy, or with
// the error and a nil new policy.
//
// build is typically func(c *Config) (*Policy, error) { return New(c, guard) }
// with one Guard for every reload. A nil build does that over a memstore.
// Reloads run one at a time, so build need not be safe for concurrent use.
//
// The first load's failure is Watch's error. For SIGHUP, see
// ReloadOnSignal.
func Watch(ctx context.Context, path string, build func(*Config) (*Policy, error), onSwap func(old, new *Policy, err error), opts ...WatchOption) (*Holder, error) {
	o := watchOptions{log: slog.Default(), debounce: 100 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if build == nil {
		// One store for every reload, so that counters survive them.
		var guard *Guard
		build = func(c *Config) (*Policy, error) {
			if c.Store.Type == StoreRedis {
				return nil, errors.New("policy: Watch needs a build function that supplies the Redis store")
			}
			if guard == nil {
				var mo []memstore.Option
				if c.Store.MaxKeys > 0 {
					mo = append(mo, memstore.WithMaxKeys(c.Store.MaxKeys))
				}
				guard = NewGuard(memstore.New(mo...), GuardConfig{Timeout: c.Store.Timeout, Breaker: c.Store.Breaker, Logger: o.log})
			}
			return New(c, guard, WithLogger(o.log))
		}
	}
	h := &Holder{path: abs, build: build, log: o.log}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, err
	}
	p, err := h.compile(data)
	if err != nil {
		return nil, err
	}
	h.p.Store(p)
	h.lastSum = sha256.Sum256(data)
	h.onSwap = onSwap

	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	addDirs := func() {
		for _, d := range watchDirs(abs) {
			if dirs[d] {
				continue
			}
			if err := w.Add(d); err == nil {
				dirs[d] = true
			} else {
				h.log.Warn("weir: cannot watch config directory", "dir", d, "err", err)
			}
		}
	}
	addDirs()
	if len(dirs) == 0 {
		w.Close()
		return nil, fmt.Errorf("policy: cannot watch the directory of %s", abs)
	}
	go func() {
		defer w.Close()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				timer.Reset(o.debounce)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				h.log.Warn("weir: watching config", "file", abs, "err", err)
				timer.Reset(o.debounce)
			case <-timer.C:
				addDirs() // a symlink may now point elsewhere
				h.reload(false)
			}
		}
	}()
	return h, nil
}

// watchDirs returns the directories whose changes can change path: its
// own, and that of the file it resolves to through symlinks.
func watchDirs(path string) []string {
	dirs := []string{filepath.Dir(path)}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		if d := filepath.Dir(real); d != dirs[0] {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// compile parses and builds a config file's content.
func (h *Holder) compile(data []byte) (*Policy, error) {
	cfg, err := Parse(data, h.path)
	if err != nil {
		return nil, err
	}
	return h.build(cfg)
}

// Reload re-reads the file and swaps in the new policy, even if the file
// is unchanged. On failure the old policy stays in force and the error says
// why. A Holder made by NewHolder has no file and returns an error.
func (h *Holder) Reload() error {
	if h.path == "" {
		return errors.New("policy: this Holder has no config file to reload")
	}
	return h.reload(true)
}

func (h *Holder) reload(force bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	data, err := os.ReadFile(h.path)
	if err != nil {
		if !force && errors.Is(err, fs.ErrNotExist) {
			// Mid-rename: the next event brings the new file.
			return nil
		}
		return h.reject(err)
	}
	if !force && len(bytes.TrimSpace(data)) == 0 {
		// A file being rewritten in place is empty for a moment; an empty
		// config would lift every limit. Wait for the next event.
		return nil
	}
	sum := sha256.Sum256(data)
	if !force && bytes.Equal(sum[:], h.lastSum[:]) {
		return nil
	}
	h.lastSum = sum
	p, err := h.compile(data)
	if err != nil {
		return h.reject(err)
	}
	old := h.p.Swap(p)
	h.ok.Add(1)
	h.log.Info("weir: config reloaded", "file", h.path, "rules", len(p.c.rules))
	if h.onSwap != nil {
		h.onSwap(old, p, nil)
	}
	return nil
}

// reject logs and counts a failed reload. h.mu must be held.
func (h *Holder) reject(err error) error {
	h.failed.Add(1)
	var ce *ConfigError
	if errors.As(err, &ce) {
		h.log.Error("weir: config rejected; the old rules stay in force", "file", h.path, "problems", len(ce.Problems))
		for _, line := range ce.Lines() {
			h.log.Error("weir: config problem", "problem", line)
		}
	} else {
		h.log.Error("weir: config rejected; the old rules stay in force", "file", h.path, "err", err)
	}
	if h.onSwap != nil {
		h.onSwap(h.p.Load(), nil, err)
	}
	return err
}

// ReloadOnSignal reloads the file whenever the process receives one of
// sigs (syscall.SIGHUP when none are given), until ctx ends or stop is
// called. While it runs, those signals no longer have their default
// effect.
func (h *Holder) ReloadOnSignal(ctx context.Context, sigs ...os.Signal) (stop func()) {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGHUP}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				_ = h.Reload() // logged and counted by reload
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

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
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
)

// Holder holds the Policy in force and swaps it atomically: requests call
// Load, and reloads (of the file, on SIGHUP, or from the admin API through
// Swap) replace it without a restart. A request that loaded the old policy
// finishes under it.
type Holder struct {
	p atomic.Pointer[Policy]

	path   string
	build  func(*config.Config) (*Policy, error)
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
// It waits for a reload under way to finish. A p built from state that a
// reload may change meanwhile should go through Update instead.
func (h *Holder) Swap(p *Policy) (old *Policy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.swapLocked(p)
}

// Update builds a policy with build and puts it in force, holding the lock
// that every reload of the file holds from reading it to the swap. A
// policy made of several sources (the file, and rules changed through an
// API or a shared store) is then always built from the latest of each and
// swapped in the order it was built: no update can overwrite a newer one
// with a policy built before it. build gets the policy in force; if it
// fails, nothing changes and its error is returned. build must not call
// the Holder's Swap, Update or Reload.
func (h *Holder) Update(build func(cur *Policy) (*Policy, error)) (*Policy, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, err := build(h.p.Load())
	if err != nil {
		return nil, err
	}
	h.swapLocked(p)
	return p, nil
}

// swapLocked puts p in force. h.mu must be held.
func (h *Holder) swapLocked(p *Policy) (old *Policy) {
	if p != nil {
		p.inherit(h.p.Load())
	}
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
	maxWait  time.Duration
}

// WatchLogger sets the logger of reloads (default slog.Default()).
func WatchLogger(l *slog.Logger) WatchOption { return func(o *watchOptions) { o.log = l } }

// WatchDebounce sets how long the file must stay quiet after a change
// before it is reloaded (default 100ms), so that an editor's several
// writes make one reload.
func WatchDebounce(d time.Duration) WatchOption { return func(o *watchOptions) { o.debounce = d } }

// WatchMaxWait bounds how long a change of the config file may wait for
// the file to go quiet (default 10 times the debounce): a file rewritten
// without pause is still reloaded at least this often.
func WatchMaxWait(d time.Duration) WatchOption { return func(o *watchOptions) { o.maxWait = d } }

// Watch loads the config file at path, builds the first Policy with build,
// and keeps it up to date until ctx ends: whenever the file changes, it is
// parsed and built again and, if that succeeds, swapped in.
//
// Watch watches the file's directory rather than the file, so it sees
// editors that write a new file and rename it over the old one, and the
// Kubernetes ConfigMap update, which swaps a "..data" symlink. Only events
// on the file, on the symlinks it goes through and on their targets count:
// a neighbouring file written all the time does not hold reloads back. A
// change is reloaded once the file has been quiet for the debounce, and
// at the latest after WatchMaxWait even if it never goes quiet. A change
// that leaves the content identical is ignored.
//
// A bad new file is rejected: its problems are logged, ReloadsFailed
// counts it, and the old policy stays in force. An empty file (blanks and
// comments only) is taken for one caught mid-write: Watch waits for the
// next event, and Reload refuses it with an error; rules: [] says there
// are no rules. onSwap, if not nil, is
// called after every reload attempt with the old and new policy, or with
// the error and a nil new policy.
//
// build is typically func(c *Config) (*Policy, error) { return New(c, guard) }
// with one guard.Guard for every reload. A nil build does that over a memstore.
// Reloads, Swap and Update run one at a time, so build need not be safe for
// concurrent use, and state that build reads and Update changes is
// consistent.
//
// The first load's failure is Watch's error. For SIGHUP, see
// ReloadOnSignal.
func Watch(ctx context.Context, path string, build func(*config.Config) (*Policy, error), onSwap func(old, new *Policy, err error), opts ...WatchOption) (*Holder, error) {
	o := watchOptions{log: slog.Default(), debounce: 100 * time.Millisecond}
	for _, f := range opts {
		f(&o)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if build == nil {
		build = memoryBuild(o.log)
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
	dw := &dirWatcher{w: w, abs: abs, dirs: map[string]bool{}, log: h.log}
	dw.add()
	if len(dw.dirs) == 0 {
		w.Close()
		return nil, fmt.Errorf("policy: cannot watch the directory of %s", abs)
	}
	go h.watch(ctx, dw, configChain(abs), o)
	return h, nil
}

// memoryBuild is Watch's build when it is given none: New over one memstore
// for every reload, so that counters survive them.
func memoryBuild(log *slog.Logger) func(*config.Config) (*Policy, error) {
	var g *guard.Guard
	return func(c *config.Config) (*Policy, error) {
		if c.Store.Type == config.StoreRedis {
			return nil, errors.New("policy: Watch needs a build function that supplies the Redis store")
		}
		if g == nil {
			var mo []memstore.Option
			if c.Store.MaxKeys > 0 {
				mo = append(mo, memstore.WithMaxKeys(c.Store.MaxKeys))
			}
			g = guard.New(memstore.New(mo...), guard.Config{Timeout: c.Store.Timeout, Breaker: c.Store.Breaker, Logger: log})
		}
		return New(c, g, WithLogger(log))
	}
}

// dirWatcher watches the directories that decide what the config file abs
// reads (watchDirs).
type dirWatcher struct {
	w    *fsnotify.Watcher
	abs  string
	dirs map[string]bool // the directories watched
	log  *slog.Logger
}

// add watches those of abs's directories not watched yet.
func (dw *dirWatcher) add() {
	for _, d := range watchDirs(dw.abs) {
		if dw.dirs[d] {
			continue
		}
		if err := dw.w.Add(d); err == nil {
			dw.dirs[d] = true
		} else {
			dw.log.Warn("weir: cannot watch config directory", "dir", d, "err", err)
		}
	}
}

// watch reloads h, debounced, after the changes dw reports on the paths of
// chain, until ctx ends; then it closes dw's watcher.
func (h *Holder) watch(ctx context.Context, dw *dirWatcher, chain linkChain, o watchOptions) {
	w, abs := dw.w, dw.abs
	maxWait := o.maxWait
	if maxWait <= 0 {
		maxWait = 10 * o.debounce
	}
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var first time.Time // the first event since the last reload; zero: none pending
	pend := func() {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		// Debounce, but never past maxWait after the first pending
		// event, so that a file rewritten without pause still loads.
		wait := o.debounce
		if left := first.Add(maxWait).Sub(now); left < wait {
			wait = max(left, 0)
		}
		timer.Reset(wait)
	}
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if !chain.concerns(ev.Name) {
				continue // a neighbour of the config: not ours
			}
			pend()
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			h.log.Warn("weir: watching config", "file", abs, "err", err)
			pend() // events may have been lost
		case <-timer.C:
			first = time.Time{}
			dw.add() // a symlink may now point elsewhere
			chain = configChain(abs)
			h.reload(false)
		}
	}
}

// linkChain is every path that decides what a config path reads: the path,
// each symlink it goes through (a file's own, or a directory's such as
// Kubernetes' "..data") and the file it resolves to.
type linkChain []string

// configChain follows path's symlinks, at most 40 as the kernel does, and
// returns every path on the way, cleaned.
func configChain(path string) linkChain {
	chain := linkChain{filepath.Clean(path)}
	p := filepath.Clean(path)
	for range 40 {
		dir, base := filepath.Split(p)
		// A symlinked directory on the way: resolve it first.
		if real, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil && real != filepath.Clean(dir) {
			chain = append(chain, filepath.Join(real, base))
		}
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			break
		}
		target, err := os.Readlink(p)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = filepath.Clean(target)
		chain = append(chain, p)
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		chain = append(chain, real)
	}
	return chain
}

// concerns reports whether an event on name can change what the config
// path reads: name is on the chain, or is a directory the chain goes
// through (a "..data" symlink swapped, or a "..2030_01_01..." directory
// created or removed by a ConfigMap update). Events on anything else in
// the watched directories, such as a neighbouring log or lock file, are
// not the config's and do not delay its reload.
func (c linkChain) concerns(name string) bool {
	name = filepath.Clean(name)
	if filepath.Base(name) == "..data" {
		return true
	}
	for _, p := range c {
		if p == name || strings.HasPrefix(p, name+string(filepath.Separator)) {
			return true
		}
	}
	return false
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
	p, err := h.compile(data)
	if err != nil {
		var ce *config.Error
		if !force && errors.As(err, &ce) && ce.Empty() {
			return nil // comments only: as above
		}
		h.lastSum = sum
		return h.reject(err)
	}
	h.lastSum = sum
	h.log.Info("weir: config reloaded", "file", h.path, "rules", len(p.c.rules))
	h.swapLocked(p)
	return nil
}

// reject logs and counts a failed reload. h.mu must be held.
func (h *Holder) reject(err error) error {
	h.failed.Add(1)
	var ce *config.Error
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

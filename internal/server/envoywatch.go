package server

import (
	"context"
	"crypto/sha256"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// EnvoySettings are the Envoy service's global settings, those
// envoyproxy/ratelimit reads from its environment. weir serve sets them
// from its --envoy-* flags.
type EnvoySettings struct {
	ShadowMode      bool // SHADOW_MODE: decide and count, always answer OK
	QuotaMode       bool // QUOTA_MODE: every descriptor in quota mode
	ResponseHeaders bool // LIMIT_RESPONSE_HEADERS_ENABLED: RateLimit-* headers
	MergeDomains    bool // MERGE_DOMAIN_CONFIG: files may share a domain
}

// WithEnvoySettings sets the Envoy service's global settings.
func WithEnvoySettings(es EnvoySettings) Option { return func(o *options) { o.envoySettings = es } }

// envoyDebounce is how long the Envoy config directory must stay quiet
// before a reload; envoyMaxWait bounds the wait when it never does.
const (
	envoyDebounce = 100 * time.Millisecond
	envoyMaxWait  = time.Second
)

// envoyState is the reload state of the Envoy config directory.
type envoyState struct {
	mu      sync.Mutex // serializes reloads
	lastSum [sha256.Size]byte
	stale   atomic.Bool  // the last reload was refused: an older config is in force
	lastOK  atomic.Int64 // Unix time of the last successful load
}

// envoyServiceOptions are the envoyrls options of the global settings.
func (s *Server) envoyServiceOptions() []envoyrls.Option {
	es := s.o.envoySettings
	return []envoyrls.Option{
		envoyrls.WithShadowMode(es.ShadowMode), envoyrls.WithQuotaMode(es.QuotaMode),
		envoyrls.WithResponseHeaders(es.ResponseHeaders), envoyrls.WithLogger(s.log),
	}
}

// envoyReservations is the envoyrls option of --envoy-reserve: the
// reservations kept where POST /v1/reserve keeps its own, under ids of
// their own.
func (s *Server) envoyReservations() envoyrls.Option {
	if !s.o.envoyReserve {
		return func(*envoyrls.Service) {}
	}
	return envoyrls.WithReservations(envoyResv{s.resv})
}

// envoyResv keeps the Envoy service's reservations in r, under
// "envoy:"+id, so that POST /v1/settle never takes one by its bare id.
type envoyResv struct{ r reservations }

func (e envoyResv) Put(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	return e.r.put(ctx, "envoy:"+id, rec, ttl)
}

func (e envoyResv) Take(ctx context.Context, id string) ([]byte, bool, error) {
	return e.r.take(ctx, "envoy:"+id)
}

// loadEnvoyDir loads the Envoy config directory with the settings, and a
// digest of the bytes it parsed.
func (s *Server) loadEnvoyDir(dir string) (*envoyrls.Config, [sha256.Size]byte, error) {
	return envoyrls.LoadDirDigest(dir, envoyrls.LoadOptions{MergeDomains: s.o.envoySettings.MergeDomains, Reserve: s.o.envoyReserve})
}

// registerEnvoyMetrics adds the Envoy service's own metrics.
func (s *Server) registerEnvoyMetrics() {
	s.metrics.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weir_envoy_unknown_domain_total",
			Help: "Envoy calls to a domain that no configuration file defines (answered OK). Not labelled: the domain comes from the request.",
		}, func() float64 { return float64(s.envoy.UnknownDomainCalls()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weir_envoy_shadow_mode_total",
			Help: "Envoy calls over their limit answered OK because of --envoy-shadow-mode (envoyproxy/ratelimit's global_shadow_mode).",
		}, func() float64 { return float64(s.envoy.ShadowedCalls()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weir_envoy_unknown_reservation_total",
			Help: "Envoy response-path calls whose weir_reservation was unknown, expired, already settled or another descriptor's (--envoy-reserve): each was answered as a plain charge, never a refund.",
		}, func() float64 { return float64(s.envoy.UnknownReservations()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "weir_envoy_pending_settlements",
			Help: "Envoy response-path settlements (--envoy-reserve) the store did not decide, kept by this instance until the store answers again.",
		}, func() float64 { return float64(s.envoy.PendingSettlements()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weir_envoy_dropped_settlements_total",
			Help: "Envoy settlements kept for the store's return and given up: more than 10,000 (or 4 MiB of keys) waiting, or not made within the reservation TTL (15 minutes).",
		}, func() float64 { return float64(s.envoy.DroppedSettlements()) }),
	)
	if s.envoyDir == "" {
		return
	}
	s.metrics.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "weir_envoy_config_stale",
			Help: "1 when the last reload of the Envoy config directory was refused, so that an older configuration is in force; 0 otherwise.",
		}, func() float64 {
			if s.envoyState.stale.Load() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "weir_envoy_config_last_success_timestamp_seconds",
			Help: "Unix time of the last successful load of the Envoy config directory.",
		}, func() float64 { return float64(s.envoyState.lastOK.Load()) }),
	)
}

// reloadEnvoy re-reads the Envoy config directory and puts it in force,
// unless it is unchanged and force is false. A refused directory leaves
// the old config in force, logged with its file:line, and marks it stale.
func (s *Server) reloadEnvoy(force bool) error {
	st := &s.envoyState
	st.mu.Lock()
	defer st.mu.Unlock()
	c, sum, err := s.loadEnvoyDir(s.envoyDir)
	if err != nil {
		s.log.Error("weir: envoy config rejected; the old one stays in force", "dir", s.envoyDir, "err", err)
		s.metrics.reload(false)
		st.stale.Store(true)
		return err
	}
	wasStale := st.stale.Swap(false)
	st.lastOK.Store(time.Now().Unix())
	if sum == st.lastSum && !force && !wasStale {
		return nil
	}
	st.lastSum = sum
	s.envoy.SetConfig(c)
	s.flushDenyCache()
	s.metrics.reload(true)
	s.log.Info("weir: envoy config reloaded", "dir", s.envoyDir, "files", len(c.Files()), "domains", len(c.Domains()))
	return nil
}

// startEnvoyWatch watches the Envoy config directory (watchEnvoyDir)
// from now on: the watches are in place when it returns.
func (s *Server) startEnvoyWatch() {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("weir: cannot watch the envoy config directory; it reloads on SIGHUP only", "dir", s.envoyDir, "err", err)
		return
	}
	abs, err := filepath.Abs(s.envoyDir)
	if err != nil {
		abs = filepath.Clean(s.envoyDir)
	}
	ew := &envoyWatcher{w: w, dir: abs, watched: map[string]bool{}}
	ew.refresh(s)
	s.goBackground(func(ctx context.Context) { s.watchEnvoyDir(ctx, ew) })
}

// watchEnvoyDir reloads the Envoy config directory, debounced, whenever
// something that decides its content changes: a file in it (added,
// written, renamed, removed), Kubernetes' "..data" symlink swapped in it,
// or a directory on its path replaced, as envoyproxy/ratelimit's runtime
// root ("current") is swapped. It runs until ctx ends.
func (s *Server) watchEnvoyDir(ctx context.Context, ew *envoyWatcher) {
	w := ew.w
	defer w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var first time.Time
	pend := func() {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		timer.Reset(max(min(envoyDebounce, first.Add(envoyMaxWait).Sub(now)), 0))
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
			if ew.concerns(ev.Name) {
				pend()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			s.log.Warn("weir: watching the envoy config directory", "dir", s.envoyDir, "err", err)
			pend() // events may have been lost
		case <-timer.C:
			first = time.Time{}
			ew.refresh(s) // a symlink on the way may point elsewhere now
			_ = s.reloadEnvoy(false)
		}
	}
}

// envoyWatcher tracks the directories watched for the Envoy config.
type envoyWatcher struct {
	w       *fsnotify.Watcher
	dir     string          // the directory as given, absolute
	real    string          // dir with its symlinks resolved; "" if it does not resolve
	watched map[string]bool // the directories watched
}

// refresh watches dir, every directory on its path (so that a component
// swapped for another, such as a runtime root symlink, is seen), and the
// directory dir resolves to; it stops watching any other.
func (ew *envoyWatcher) refresh(s *Server) {
	ew.real, _ = filepath.EvalSymlinks(ew.dir)
	want := map[string]bool{ew.dir: true}
	for d := ew.dir; ; {
		p := filepath.Dir(d)
		if p == d {
			break
		}
		want[p] = true
		d = p
	}
	if ew.real != "" {
		want[ew.real] = true
	}
	for d := range ew.watched {
		if !want[d] {
			_ = ew.w.Remove(d)
			delete(ew.watched, d)
		}
	}
	for d := range want {
		if ew.watched[d] {
			continue
		}
		if err := ew.w.Add(d); err == nil {
			ew.watched[d] = true
		} else if d == ew.dir {
			s.log.Warn("weir: cannot watch the envoy config directory", "dir", d, "err", err)
		}
	}
}

// concerns reports whether an event on name can change what the config
// directory holds: an entry of the directory (as given or resolved,
// including dot names such as "..data"), or a directory on its path.
func (ew *envoyWatcher) concerns(name string) bool {
	name = filepath.Clean(name)
	parent := filepath.Dir(name)
	if parent == ew.dir || (ew.real != "" && parent == ew.real) {
		return true
	}
	sep := string(filepath.Separator)
	return name == ew.dir || strings.HasPrefix(ew.dir, name+sep) ||
		(ew.real != "" && (name == ew.real || strings.HasPrefix(ew.real, name+sep)))
}

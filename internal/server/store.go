package server

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/tlsfiles"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
)

// redisKeys names the keys the service writes besides the limiter state,
// all under the deployment's prefix (store.redis.prefix, the limiter
// state's too), so that deployments sharing a Redis share nothing. No
// command touches two of them at once, so they need no common hash tag on
// a cluster.
type redisKeys struct {
	blocked      string // ZSET rule\x00identity → blocked_until ms
	fleetPrefix  string // + instance id: per-second counters, short TTL
	fleetIndex   string // ZSET instance id → last report, ms
	rules        string // the YAML PUT /v1/rules stored, after a line with its version
	rulesVersion string // the version of the stored rules (random); instances poll it
	denyCache    string // the deny cache's pub/sub channel (not a key)
	reservation  string // + reservation id: an open reservation of POST /v1/reserve
	spend        string // + {rule:period start}: ZSET identity → settled cost (spend.go)
}

// keysFor returns the service's key names under prefix ("" is
// redisstore.DefaultPrefix, which gives the names of earlier versions).
func keysFor(prefix string) redisKeys {
	if prefix == "" {
		prefix = redisstore.DefaultPrefix
	}
	return redisKeys{
		blocked:      prefix + ":index:blocked",
		fleetPrefix:  prefix + ":fleet:",
		fleetIndex:   prefix + ":fleet",
		rules:        prefix + ":config:rules",
		rulesVersion: prefix + ":config:rules:version",
		denyCache:    prefix + ":denycache",
		reservation:  prefix + ":r:",
		spend:        prefix + ":spend:",
	}
}

// storeInfo describes the store for the dashboard.
type storeInfo struct {
	Type      string   // memory | redis
	Topology  string   // memory | standalone | sentinel | cluster
	Nodes     []string // Redis addresses
	Scripting string   // Redis: functions | eval (redisstore.Store.Scripting)
}

func (i storeInfo) String() string {
	if i.Type != config.StoreRedis {
		return i.Type
	}
	d := i.Type + " " + i.Topology + " " + strings.Join(i.Nodes, ",")
	if i.Scripting != "" {
		d += " (scripts as " + i.Scripting + ")"
	}
	return d
}

// applyRedisURL points cfg's store at the Redis that url names.
func applyRedisURL(cfg *config.Config, url string) error {
	rc, err := redisstore.ParseURL(url)
	if err != nil {
		return fmt.Errorf("server: --redis: %s", redactURL(err.Error(), url))
	}
	cfg.Store.Type = config.StoreRedis
	cfg.Store.Redis = config.RedisConfig{
		Addrs:      rc.Addrs,
		MasterName: rc.MasterName,
		Username:   rc.Username,
		Password:   rc.Password,
		TLS:        rc.TLS != nil,
		DB:         rc.DB,
		// The URL says where Redis is; the config's tuning and TLS
		// files stay.
		TLSCA:         cfg.Store.Redis.TLSCA,
		TLSCert:       cfg.Store.Redis.TLSCert,
		TLSKey:        cfg.Store.Redis.TLSKey,
		TLSServerName: cfg.Store.Redis.TLSServerName,
		MaxInFlight:   cfg.Store.Redis.MaxInFlight,
		MaxBatch:      cfg.Store.Redis.MaxBatch,
		Linger:        cfg.Store.Redis.Linger,
		Prefix:        cfg.Store.Redis.Prefix,
	}
	return nil
}

// applyStore applies the options that override cfg's store section:
// WithRedisURL, WithStoreTimeout and WithRedisTLS's files.
func (o *options) applyStore(cfg *config.Config) error {
	if o.redisURL != "" {
		if err := applyRedisURL(cfg, o.redisURL); err != nil {
			return err
		}
	}
	if o.storeTimeout > 0 {
		cfg.Store.Timeout = o.storeTimeout
	}
	if t := o.redisTLS; t != nil {
		if cfg.Store.Type != config.StoreRedis && o.redis == nil && o.store == nil {
			return fmt.Errorf("server: --redis-tls-*: the store is %q, not Redis (give --redis, or store.type: redis in the config)", cfg.Store.Type)
		}
		r := &cfg.Store.Redis
		for _, f := range []struct {
			dst *string
			v   string
		}{{&r.TLSCA, t.ca}, {&r.TLSCert, t.cert}, {&r.TLSKey, t.key}} {
			if f.v != "" {
				*f.dst = f.v
			}
		}
	}
	return nil
}

// redactURL removes the password of url from msg, which quotes it.
func redactURL(msg, rawURL string) string {
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return msg
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return msg
	}
	userinfo := rest[:at]
	if _, pw, ok := strings.Cut(userinfo, ":"); ok && pw != "" {
		msg = strings.ReplaceAll(msg, pw, "[redacted]")
	}
	return msg
}

// redisConfig converts the config's store section for redisstore; its
// error names a TLS file that cannot be read.
func redisConfig(sc config.StoreConfig) (redisstore.Config, error) {
	r := sc.Redis
	rc := redisstore.Config{
		Addrs:       r.Addrs,
		MasterName:  r.MasterName,
		Username:    r.Username,
		Password:    r.PasswordValue(),
		DB:          r.DB,
		Timeout:     sc.Timeout,
		MaxInFlight: r.MaxInFlight,
		MaxBatch:    r.MaxBatch,
		Linger:      r.LingerValue(),
		Prefix:      r.Prefix,
		Overrides:   true, // PUT /v1/overrides (override.go)
	}
	if rc.Timeout <= 0 {
		rc.Timeout = guard.DefaultTimeout // the guard's, so that the store keeps it
	}
	if r.TLSOn() {
		src, err := tlsfiles.New(r.TLSCert, r.TLSKey, r.TLSCA)
		if err != nil {
			return rc, fmt.Errorf("server: store.redis: %w", err)
		}
		rc.TLS = src.ClientConfig(r.TLSServerName)
	}
	return rc, nil
}

// openStore opens the store the options or cfg name and keeps it in
// s.store, with what the stack and the service need of it: for Redis the
// concrete store (s.redis) and its client (s.rdb), over which the
// service's own keys and the reservations go; for memory s.mem. A store
// of the caller's (WithStore) keeps its reservations in a bounded map, as
// memory does.
func (s *Server) openStore(cfg *config.Config) error {
	switch {
	case s.o.redis != nil:
		s.useRedis(s.o.redis, cfg)
		return nil
	case s.o.store != nil:
		s.store = s.o.store
		s.resv = newMemReservations(s.now, maxReservations)
		s.setInfo(storeInfo{Type: fmt.Sprintf("%T", s.store), Topology: "custom"})
		return nil
	case cfg.Store.Type != config.StoreRedis:
		var mo []memstore.Option
		if cfg.Store.MaxKeys > 0 {
			mo = append(mo, memstore.WithMaxKeys(cfg.Store.MaxKeys))
		}
		s.store, s.mem = memstore.New(mo...), true
		s.resv = newMemReservations(s.now, maxReservations)
		s.setInfo(storeInfo{Type: config.StoreMemory, Topology: "memory"})
		return nil
	}
	rc, err := redisConfig(cfg.Store)
	if err != nil {
		return err
	}
	if t := s.o.redisTLS; t != nil && t.anyName && rc.TLS != nil {
		rc.TLS = tlsfiles.AnyName(rc.TLS)
	}
	// Lazy: with Redis down at start, serve anyway. Decisions fail fast
	// (on_error decides), /healthz/store says down, and the store connects
	// and sets up in the background when Redis answers.
	rc.Lazy, rc.Logger = true, s.log
	ctx, cancel := context.WithTimeout(s.bgCtx, 10*time.Second)
	defer cancel()
	rs, err := redisstore.New(ctx, rc)
	if err != nil {
		return fmt.Errorf("server: Redis store at %s: %w", strings.Join(rc.Addrs, ","), err)
	}
	if !rs.Connected() {
		s.log.Warn("weir: Redis unreachable at start; serving anyway, on_error decides until it answers",
			"redis", strings.Join(rc.Addrs, ","))
	}
	s.owned = func() { rs.Close() }
	s.useRedis(rs, cfg)
	return nil
}

// useRedis makes rs the store. The service's own keys (rules, fleet,
// penalty-box index, reservations) go over its client, which follows its
// connection.
func (s *Server) useRedis(rs *redisstore.Store, cfg *config.Config) {
	s.store, s.redis, s.rdb = rs, rs, rs.Client()
	s.resv = redisReservations{c: s.rdb, prefix: s.keys.reservation, timeout: rs.Timeout()}
	s.setInfo(s.redisInfo(cfg.Store.Redis))
}

// redisInfo describes a Redis store: its nodes as the config names them,
// or as the client knows them on a cluster, under Sentinel, or when the
// config names none (a store of the caller's).
func redisInfo(r config.RedisConfig, c rueidis.Client) storeInfo {
	info := storeInfo{Type: config.StoreRedis, Topology: "standalone", Nodes: append([]string(nil), r.Addrs...)}
	switch {
	case r.MasterName != "":
		info.Topology = "sentinel"
	case c != nil && c.Mode() == rueidis.ClientModeCluster:
		info.Topology = "cluster"
	}
	if c != nil && (info.Topology != "standalone" || len(info.Nodes) == 0) {
		nodes := make([]string, 0, len(c.Nodes()))
		for addr := range c.Nodes() {
			nodes = append(nodes, addr)
		}
		if len(nodes) > 0 {
			sort.Strings(nodes)
			info.Nodes = nodes
		}
	}
	return info
}

// redisInfo describes the Redis store now: its nodes (which change on a
// cluster or after a failover) and how it runs its scripts.
func (s *Server) redisInfo(r config.RedisConfig) storeInfo {
	info := redisInfo(r, s.rdb)
	if s.redis != nil {
		info.Scripting = s.redis.Scripting()
	}
	return info
}

// readyLimit is the limit under which the store health probe
// (/healthz/store, and weir_store_up in the background) peeks at the
// instance's own key, weir.Key("weir-readyz", id): a name from when
// /readyz followed the store, which it no longer does. Peeking consumes
// nothing and writes nothing.
var readyLimit = weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Second}

// probe asks the store for a peek within the store timeout and records
// whether it answered.
func (s *Server) probe(ctx context.Context) bool {
	_, err := s.guard.Take(ctx, weir.Key("weir-readyz", s.id), readyLimit, 0)
	ok := err == nil
	s.healthy.Store(ok)
	if !ok {
		s.lastStoreErr.Store(s.now().UnixNano())
	}
	return ok
}

func (s *Server) probeLoop(ctx context.Context) {
	t := time.NewTicker(s.o.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.probe(ctx)
			if i := s.storeInfo(); i.Type == config.StoreRedis {
				s.setInfo(s.redisInfo(s.base.Load().Store.Redis))
			}
		}
	}
}

func (s *Server) storeInfo() storeInfo { return *s.info.Load() }

func (s *Server) setInfo(i storeInfo) { s.info.Store(&i) }

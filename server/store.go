package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
)

// Redis keys the service writes besides the limiter state.
const (
	blockedKey      = "weir:index:blocked"        // ZSET rule\x00identity → blocked_until ms
	fleetKeyPrefix  = "weir:fleet:"               // + instance id: per-second counters, short TTL
	fleetIndexKey   = "weir:fleet"                // ZSET instance id → last report, ms
	rulesKey        = "weir:config:rules"         // the YAML PUT /v1/rules stored
	rulesVersionKey = "weir:config:rules:version" // INCR on every change; instances poll it
)

// storeInfo describes the store for the dashboard.
type storeInfo struct {
	Type      string   // memory | redis
	Topology  string   // memory | standalone | sentinel | cluster
	Nodes     []string // Redis addresses
	Scripting string   // Redis: functions | eval (redisstore.Store.Scripting)
}

func (i storeInfo) String() string {
	if i.Type != policy.StoreRedis {
		return i.Type
	}
	d := i.Type + " " + i.Topology + " " + strings.Join(i.Nodes, ",")
	if i.Scripting != "" {
		d += " (scripts as " + i.Scripting + ")"
	}
	return d
}

// applyRedisURL points cfg's store at the Redis that url names.
func applyRedisURL(cfg *policy.Config, url string) error {
	rc, err := redisstore.ParseURL(url)
	if err != nil {
		return fmt.Errorf("server: --redis: %s", redactURL(err.Error(), url))
	}
	cfg.Store.Type = policy.StoreRedis
	cfg.Store.Redis = policy.RedisConfig{
		Addrs:      rc.Addrs,
		MasterName: rc.MasterName,
		Username:   rc.Username,
		Password:   rc.Password,
		TLS:        rc.TLS != nil,
		DB:         rc.DB,
		// The URL says where Redis is; the config's tuning stays.
		MaxInFlight: cfg.Store.Redis.MaxInFlight,
		MaxBatch:    cfg.Store.Redis.MaxBatch,
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

// redisConfig converts the config's store section for redisstore.
func redisConfig(sc policy.StoreConfig) redisstore.Config {
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
	}
	if rc.Timeout <= 0 {
		rc.Timeout = policy.DefaultTimeout // the guard's, so that the store keeps it
	}
	if r.TLS {
		rc.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return rc
}

// clientStore is a store that shares its Redis client, so that the service
// needs no second connection pool.
type clientStore interface {
	Client() rueidis.Client
}

// openStore sets s.store, s.rdb and s.info from the options and cfg.
func (s *Server) openStore(cfg *policy.Config) error {
	if s.o.store != nil {
		s.store = s.o.store
		s.setInfo(storeInfo{Type: policy.StoreMemory, Topology: "memory"})
		if _, ok := s.store.(*memstore.Store); !ok {
			s.setInfo(storeInfo{Type: fmt.Sprintf("%T", s.store), Topology: "custom"})
		}
		if cs, ok := s.store.(clientStore); ok {
			s.rdb = cs.Client()
			s.setInfo(redisInfo(cfg.Store.Redis, s.rdb))
		}
		return nil
	}
	if cfg.Store.Type != policy.StoreRedis {
		var mo []memstore.Option
		if cfg.Store.MaxKeys > 0 {
			mo = append(mo, memstore.WithMaxKeys(cfg.Store.MaxKeys))
		}
		s.store = memstore.New(mo...)
		s.setInfo(storeInfo{Type: policy.StoreMemory, Topology: "memory"})
		return nil
	}
	rc := redisConfig(cfg.Store)
	ctx, cancel := context.WithTimeout(s.bgCtx, 10*time.Second)
	defer cancel()
	rs, err := redisstore.New(ctx, rc)
	if err != nil {
		return fmt.Errorf("server: Redis store at %s: %w", strings.Join(rc.Addrs, ","), err)
	}
	s.store = rs
	var st weir.Store = rs
	if cs, ok := st.(clientStore); ok {
		s.rdb = cs.Client()
		s.owned = func() { rs.Close() }
	} else {
		// The store keeps its client to itself: open a second, small one
		// for the index, the fleet counters and the rules.
		c, err := newRedisClient(rc)
		if err != nil {
			rs.Close()
			return fmt.Errorf("server: Redis at %s: %w", strings.Join(rc.Addrs, ","), err)
		}
		s.rdb = c
		s.owned = func() { c.Close(); rs.Close() }
	}
	s.setInfo(s.redisInfo(cfg.Store.Redis))
	return nil
}

// newRedisClient opens a client as redisstore.New does.
func newRedisClient(rc redisstore.Config) (rueidis.Client, error) {
	opt := rueidis.ClientOption{
		InitAddress:  rc.Addrs,
		Username:     rc.Username,
		Password:     rc.Password,
		SelectDB:     rc.DB,
		TLSConfig:    rc.TLS,
		DisableCache: true,
		Dialer:       net.Dialer{Timeout: 2 * time.Second, KeepAlive: time.Second},
	}
	if rc.MasterName != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: rc.MasterName,
			Username:  rc.SentinelUsername,
			Password:  rc.SentinelPassword,
			TLSConfig: rc.TLS,
			Dialer:    opt.Dialer,
		}
	}
	return rueidis.NewClient(opt)
}

// redisInfo describes a Redis store.
func redisInfo(r policy.RedisConfig, c rueidis.Client) storeInfo {
	info := storeInfo{Type: policy.StoreRedis, Topology: "standalone", Nodes: append([]string(nil), r.Addrs...)}
	switch {
	case r.MasterName != "":
		info.Topology = "sentinel"
	case c != nil && c.Mode() == rueidis.ClientModeCluster:
		info.Topology = "cluster"
	}
	if c != nil && info.Topology != "standalone" {
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
func (s *Server) redisInfo(r policy.RedisConfig) storeInfo {
	info := redisInfo(r, s.rdb)
	if rs, ok := s.store.(*redisstore.Store); ok {
		info.Scripting = rs.Scripting()
	}
	return info
}

// readyKey is the key the readiness probe peeks at. Peeking consumes
// nothing and writes nothing.
var readyLimit = weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Second}

// probe asks the store for a peek within the store timeout and records
// whether it answered.
func (s *Server) probe(ctx context.Context) bool {
	_, err := s.guard.Take(ctx, weir.Key("weir-readyz", s.id), readyLimit, 0)
	ok := err == nil
	s.healthy.Store(ok)
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
			if i := s.storeInfo(); i.Type == policy.StoreRedis {
				s.setInfo(s.redisInfo(s.base.Load().Store.Redis))
			}
		}
	}
}

func (s *Server) storeInfo() storeInfo { return *s.info.Load() }

func (s *Server) setInfo(i storeInfo) { s.info.Store(&i) }

package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
)

// The store's connection: made at once or in the background (Config.Lazy),
// and replaced when a standalone Redis keeps answering READONLY.

// swapClient is the rueidis.Client the store calls, and that Store.Client
// lends to others. It forwards every call to the client in force: until
// the store has connected, a closed client on which every call fails at
// once with rueidis.ErrClosing; then the connected client, which a
// reconnect replaces. Forwarding costs one atomic load per call.
type swapClient struct {
	cur atomic.Pointer[clientRef]
}

type clientRef struct{ c rueidis.Client }

func (c *swapClient) get() rueidis.Client { return c.cur.Load().c }

// swap puts n in force and returns the client it replaces.
func (c *swapClient) swap(n rueidis.Client) rueidis.Client {
	old := c.cur.Swap(&clientRef{n})
	if old == nil {
		return nil
	}
	return old.c
}

func (c *swapClient) B() rueidis.Builder { return c.get().B() }
func (c *swapClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return c.get().Do(ctx, cmd)
}
func (c *swapClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	return c.get().DoMulti(ctx, multi...)
}
func (c *swapClient) Receive(ctx context.Context, subscribe rueidis.Completed, fn func(msg rueidis.PubSubMessage)) error {
	return c.get().Receive(ctx, subscribe, fn)
}
func (c *swapClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return c.get().DoCache(ctx, cmd, ttl)
}
func (c *swapClient) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return c.get().DoMultiCache(ctx, multi...)
}
func (c *swapClient) DoStream(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResultStream {
	return c.get().DoStream(ctx, cmd)
}
func (c *swapClient) DoMultiStream(ctx context.Context, multi ...rueidis.Completed) rueidis.MultiRedisResultStream {
	return c.get().DoMultiStream(ctx, multi...)
}
func (c *swapClient) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return c.get().Dedicated(fn)
}
func (c *swapClient) Dedicate() (rueidis.DedicatedClient, func()) { return c.get().Dedicate() }
func (c *swapClient) Nodes() map[string]rueidis.Client            { return c.get().Nodes() }
func (c *swapClient) Mode() rueidis.ClientMode                    { return c.get().Mode() }
func (c *swapClient) Close()                                      { c.get().Close() }

var errNotConnected = errors.New("not connected")

// closedClient returns a client that was never connected and is closed:
// every call on it fails at once with rueidis.ErrClosing, and it dials
// nothing. It stands in until the store connects.
func closedClient() rueidis.Client {
	c, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{"weir-not-connected:0"},
		ForceSingleClient: true,
		DisableCache:      true,
		DialCtxFn: func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
			return nil, errNotConnected
		},
	})
	c.Close()
	return c
}

// clientOption returns the options of a new client.
func (c *conn) clientOption() rueidis.ClientOption {
	opt := c.opt
	n := c.clients.Add(1)
	if dial := c.dial; dial != nil {
		opt.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
			return dial(ctx, addr, n)
		}
	}
	return opt
}

// dialClient makes a rueidis client with opt, or gives up when ctx ends
// (closing the client if it turns up after all).
func dialClient(ctx context.Context, opt rueidis.ClientOption) (rueidis.Client, error) {
	type made struct {
		c   rueidis.Client
		err error
	}
	done := make(chan made, 1)
	go func() {
		c, err := rueidis.NewClient(opt)
		done <- made{c, err}
	}()
	select {
	case m := <-done:
		return m.c, m.err
	case <-ctx.Done():
		go func() {
			if m := <-done; m.c != nil {
				m.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// conn is the store's connection state, apart from the client itself.
type conn struct {
	opt          rueidis.ClientOption
	dial         func(ctx context.Context, addr string, client int64) (net.Conn, error) // Config.dial
	clients      atomic.Int64                                                           // clients made
	addrs        string                                                                 // for messages
	clusterAsked bool
	borrowed     bool // the client is the caller's (NewWithClient): never closed nor replaced
	log          *slog.Logger

	connected atomic.Bool // the client in force is a connected one
	lastErr   atomic.Pointer[string]

	mu     sync.Mutex // serialises publishing a client with Close
	closed bool
	stop   chan struct{} // closed by Close: the background loops end

	// READONLY from a standalone Redis (a primary demoted behind a DNS
	// name): roSince is when the current run of READONLY replies began
	// (UnixNano, 0 when none), lastReconnect when the store last replaced
	// its client for it.
	roSince       atomic.Int64
	lastReconnect atomic.Int64
	reconnects    atomic.Int64 // clients replaced after READONLY (tests report it)
}

// How long READONLY must persist from a standalone Redis before the store
// dials it again, and the least time between two such reconnects.
const (
	readOnlyReconnectAfter = time.Second
	readOnlyReconnectEvery = 5 * time.Second
)

// Bounds of the background connection attempts' backoff.
const (
	connectBackoffMin = 250 * time.Millisecond
	connectBackoffMax = 5 * time.Second
)

// notConnectedError is what a call gets before the store has connected.
func (s *Store) notConnectedError() error {
	last := "none yet"
	if p := s.conn.lastErr.Load(); p != nil {
		last = *p
	}
	return fmt.Errorf("no connection to Redis at %s yet (retrying in the background; last attempt: %s)", s.conn.addrs, last)
}

// Connected reports whether the store has connected to Redis. A store
// built with Config.Lazy starts unconnected when Redis does not answer,
// and connects in the background; one built without it is connected from
// New on. A connected store can still find Redis down later: calls then
// fail until it returns.
func (s *Store) Connected() bool { return s.conn.connected.Load() }

// Client returns the store's Redis client, so that a caller can send
// commands of its own over the store's connections (weir serve does, for
// its rules, fleet view and penalty-box index). The client follows the
// store: until a lazy store connects, every call fails at once with
// rueidis.ErrClosing; after a reconnect it uses the new connection. Close
// the store, not the client. For a store built by NewWithClient it
// forwards to the caller's client, until the store is closed.
func (s *Store) Client() rueidis.Client { return s.client }

// connect makes the client with ctx's deadline and sets the store up on it.
func (s *Store) connect(ctx context.Context, cfg *Config) error {
	c, err := dialClient(ctx, s.conn.clientOption())
	if err != nil {
		msg := err.Error()
		s.conn.lastErr.Store(&msg)
		return fmt.Errorf("%w: connect to %s: %w", weir.ErrStore, s.conn.addrs, err)
	}
	return s.setup(ctx, c, cfg)
}

// setup puts the connected client c in force: it learns the topology,
// loads the library, and only then marks the store connected, so that the
// fields it sets are read after it.
func (s *Store) setup(ctx context.Context, c rueidis.Client, cfg *Config) error {
	cluster := c.Mode() == rueidis.ClientModeCluster
	if s.conn.clusterAsked && !cluster { // never for a borrowed client
		c.Close()
		err := fmt.Errorf("redisstore: %d addresses given (%s) but they are not a Redis Cluster", len(cfg.Addrs), s.conn.addrs)
		msg := err.Error()
		s.conn.lastErr.Store(&msg)
		return err
	}
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if s.conn.closed { // never for a borrowed client, set up before New returns
		c.Close()
		return errors.New("redisstore: closed")
	}
	s.cluster = cluster
	s.standalone = !cluster && cfg.MasterName == "" && len(cfg.Addrs) == 1
	if cfg.MaxBatch != 1 {
		inFlight, maxBatch := cfg.MaxInFlight, cfg.MaxBatch
		if inFlight == 0 {
			inFlight = DefaultMaxInFlight
		}
		if maxBatch == 0 {
			maxBatch = DefaultMaxBatch
		}
		if cluster {
			s.nodes = newNodeQueues(s, inFlight, maxBatch, cfg.Linger)
		} else {
			s.coalesce = newCoalescer(s, inFlight, maxBatch, cfg.Linger, "")
		}
	}
	s.client.swap(c) // the closed stand-in needs no closing
	// Load the library now, so the first decisions need not. If this fails
	// for a passing reason, the first FCALL that finds no library loads it.
	s.functions.Store(!cfg.evalOnly)
	if !cfg.evalOnly {
		_ = s.loadLibrary(ctx)
	}
	if s.nodes != nil {
		// The slot table, so the first decisions find their nodes' queues;
		// if it cannot be read now, they go alone until it is.
		_ = s.nodes.load(ctx)
	}
	s.conn.connected.Store(true)
	return nil
}

// connectLoop retries connecting until it succeeds or the store closes.
func (s *Store) connectLoop(cfg Config) {
	backoff := connectBackoffMin
	logged := false
	for {
		t := time.NewTimer(backoff)
		select {
		case <-s.conn.stop:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.connect(ctx, &cfg)
		cancel()
		if err != nil && !errors.Is(err, weir.ErrStore) && s.conn.log != nil && !logged {
			logged = true
			s.conn.log.Error("weir: Redis answers, but not as configured; retrying", "redis", s.conn.addrs, "err", err)
		}
		if err == nil {
			if s.conn.log != nil {
				s.conn.log.Info("weir: Redis reachable; set up", "redis", s.conn.addrs, "scripting", s.Scripting())
			}
			return
		}
		backoff = min(2*backoff, connectBackoffMax)
	}
}

// readOnly notes a READONLY reply from a standalone Redis. When they have
// come for readOnlyReconnectAfter, the server the store is connected to
// is a replica now: a primary demoted behind a DNS name (ElastiCache,
// Azure) that now names another server. The store then dials the address
// again, at most once per readOnlyReconnectEvery.
func (s *Store) readOnly() {
	now := time.Now().UnixNano()
	since := s.conn.roSince.Load()
	if since == 0 {
		s.conn.roSince.CompareAndSwap(0, now)
		return
	}
	if now-since < int64(readOnlyReconnectAfter) {
		return
	}
	last := s.conn.lastReconnect.Load()
	if last != 0 && now-last < int64(readOnlyReconnectEvery) {
		return
	}
	if !s.conn.lastReconnect.CompareAndSwap(last, now) {
		return
	}
	go s.reconnect(time.Duration(now - since))
}

// reconnect replaces the client with a new one to the same address, and
// closes the old one once the calls it carries have ended.
func (s *Store) reconnect(after time.Duration) {
	if s.conn.log != nil {
		s.conn.log.Warn("weir: Redis answers READONLY: reconnecting, in case its address now names another primary", "redis", s.conn.addrs, "for", after.Round(time.Millisecond).String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialClient(ctx, s.conn.clientOption())
	if err != nil {
		if s.conn.log != nil {
			s.conn.log.Warn("weir: reconnecting to Redis failed; the old connection stays", "redis", s.conn.addrs, "err", err)
		}
		return
	}
	s.conn.mu.Lock()
	if s.conn.closed {
		s.conn.mu.Unlock()
		c.Close()
		return
	}
	old := s.client.swap(c)
	s.conn.roSince.Store(0)
	s.conn.reconnects.Add(1)
	s.conn.mu.Unlock()
	if s.functions.Load() {
		_ = s.loadLibrary(ctx) // a new primary may lack it; a missing library is loaded on demand anyway
	}
	// Calls already on the old client end by their deadline.
	time.AfterFunc(2*s.timeout+time.Second, old.Close)
}

// isReadOnly reports Redis's refusal of a write on a replica.
func isReadOnly(e *rueidis.RedisError) bool { return strings.HasPrefix(e.Error(), "READONLY") }

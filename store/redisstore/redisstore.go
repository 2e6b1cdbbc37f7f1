// Package redisstore is weir's Redis store: many weir instances share one
// limit through Redis 7 or Valkey, standalone, under Sentinel, or as a Redis
// Cluster.
//
// # Model
//
// Every decision is one Lua script that runs atomically inside Redis. It
// reads the clock with Redis TIME, loads the key's state and penalty box,
// runs the same integer math as package algorithm (the memory store's
// reference implementation; the Lua mirrors it line for line and the
// storetest suite checks that both agree to the microsecond), writes the
// new state with a TTL, and returns everything the Result needs in one
// reply. Because the clock is Redis's, application servers whose clocks
// disagree still make identical decisions: the Go side never reads its own
// clock to decide anything.
//
// The Lua lives in scripts/: a shared prelude, one file per algorithm, and
// four drivers (take, the batch of independent takes that coalescing sends,
// the multi-key take and refund of TakeAll, and lease release). On Redis 7 and Valkey they form one Redis Functions library,
// "weir_<hash of the code>", which New loads on every primary with
// FUNCTION LOAD and every decision calls with FCALL. Loading builds the
// prelude's functions once, which makes a decision about 15% cheaper for
// Redis than the same code sent as a script (docs/benchmarks.md). When a call finds the library
// missing (a Redis restarted without persistence, FUNCTION FLUSH, a new
// cluster node), nothing ran: the store loads it again, once however many
// calls noticed, and repeats the call. Where FUNCTION LOAD is unknown
// (Redis 6) or forbidden by the ACL, the store runs the same code as one
// EVALSHA script per algorithm; on NOSCRIPT the call is repeated once with
// EVAL, which also reloads the script. Scripting reports which form is in
// use. Because the library's name carries its code's hash, weir versions
// with different scripts can share a Redis during a rolling upgrade; an old
// version's library stays until FUNCTION DELETE removes it.
//
// TRYAGAIN, CLUSTERDOWN, LOADING, READONLY
// and MASTERDOWN replies, which Redis sends without running anything of the
// script (slot migrations, failovers), are retried with a short backoff
// until the call's deadline. Any other failure, in particular a timeout or
// a broken connection, is returned as an error wrapping weir.ErrStore and
// never replayed: the script may or may not have run, and replaying it
// could consume twice.
//
// While a penalty box holds a key, a decision only reads the box and the
// state (to report the later of the box's end and the algorithm's own
// RetryAfter, exactly as package algorithm does); it writes nothing, beyond
// dropping expired sliding-log entries and leases. A limit without Block
// ignores any box on its key, as package algorithm does, and never reads it.
//
// # Coalescing
//
// On a standalone or Sentinel deployment the store keeps at most
// Config.MaxInFlight decision calls (2 by default) out to Redis at a time.
// A Take (or a TakeAll of one request) that finds one free sends its
// decision at once, alone. One that finds them all busy joins a queue, and
// when a call returns, everything queued then, up to Config.MaxBatch (64),
// leaves together in one call of the batch function. Under light load
// nothing waits and every decision goes alone; under load batches form by
// themselves, and Redis does much less work per decision: one command to
// read and answer, one clock reading and one copy of each limit's
// constants per batch, instead of one per decision (docs/benchmarks.md
// has the figures). The calls out never exceed MaxInFlight per Store, so a
// fleet of weir instances cannot flood Redis with calls either.
//
// A batch is an atomic sequence of ordinary decisions: each is exactly the
// decision it would get alone, made in queue order, and decisions on one key
// see each other as consecutive calls do. Batching never changes a count.
// One decision's failure (a key of the wrong type, say) fails that decision
// only. A refusal that runs nothing (TRYAGAIN, LOADING, a missing library)
// is retried for the whole batch, as for a single call; so is READONLY,
// which a batch script running on a replica answers for the whole batch
// (no decision there could write).
//
// Deadlines need no timer per call. A queued decision carries its own
// deadline (the store's timeout from when it was made, or the caller's
// deadline if sooner). The calls ahead of it were all sent before it came,
// so they end before it must; a batch is sent with the earliest deadline of
// its members; and a decision whose deadline passed while it waited is
// failed without being sent. A caller whose context ends while it waits
// leaves the queue, and its decision is never sent. One whose context ends
// after its batch was sent gets the context's error, and as with any
// timeout its decision may or may not have been made.
//
// A Redis Cluster gets no coalescing: one call cannot span two slots, and
// keys are spread over all of them, so every decision is a call of its
// own, as with MaxBatch 1.
//
// # Keys
//
// The state of key under an algorithm lives in "<prefix>:{<key>}:<algorithm>"
// and its penalty box in "<prefix>:{<key>}:block". The braces make the key a
// Redis Cluster hash tag, so both live in one slot and one script can touch
// them. The key is escaped so that it can never contain a brace (\ → \\,
// { → \[, } → \], a leading ~ → \~, the empty key → \e) and
// an escaped key over 200 bytes is replaced by "~" and its SHA-256, so no
// two keys ever share Redis keys. The penalty box is shared by all the
// algorithms of one key (memstore keeps one per key and algorithm; a key
// normally has one algorithm, so the difference only shows when one key is
// limited under two algorithms with Block set).
//
// State per algorithm: fixed_window a string "<window>:<count>";
// sliding_log a ZSET of one member per admitted event scored by its µs
// timestamp; sliding_window a hash {w, cur, prev}; token_bucket a hash
// {tokens, ts}; leaky_bucket a hash {level, ts}; gcra a string
// "<tat_us>:<frac>"; concurrency a ZSET of lease slots scored by expiry µs
// (a lease of weight n is n members). Every key written carries a PEXPIRE
// equal to the Decision's ResetAfter (rounded up to the millisecond), the
// penalty box one equal to Block, so nothing outlives the time it can
// matter and an idle key costs nothing. The two ZSET algorithms cost one
// member per event (sliding_log) or per slot (concurrency), in time and
// memory, like the memory store's log: a single take of cost n writes n
// members. Lease ids must be unique per key; weir.NewLeaseID's are.
//
// # Batches
//
// TakeAll is all or nothing. When every key of the batch hashes to one slot
// (always, on a standalone or Sentinel deployment), one script checks every
// request without writing, then takes them all or, if one is rejected,
// consumes nothing and starts only the rejected requests' penalty boxes: the
// exact semantics of memstore.TakeAll, atomically. On a cluster a batch that
// spans slots cannot be one script. TakeAll then runs the all-or-nothing
// script once per slot, all slots at once; if any slot rejects (or fails),
// the slots that admitted are refunded: a refund script gives back exactly
// what each request was granted and reports what a check would say now.
// This is not atomic. Between a slot's take and its refund (one round trip,
// plus the time the slowest slot takes to answer) other clients see that
// slot's capacity as consumed and may be rejected by it; the batch itself
// never over-admits. If a refund cannot be delivered (Redis unreachable, or
// this process dies in that window) the capacity stays consumed until the
// state expires, and TakeAll returns an error. When a slot's call fails with
// a network error or timeout, that slot may or may not have consumed; the
// others are refunded and the error is returned.
//
// # Failures
//
// Every call runs under Config.Timeout (or the caller's earlier deadline);
// Timeout reports it, so that a caller (policy.Guard) need not add its own.
// When Redis is unreachable the store returns an error wrapping
// weir.ErrStore once the deadline passes and reconnects by itself when Redis
// returns; there is nothing to restart.
package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// DefaultTimeout is the per-call deadline when Config.Timeout is zero: long
// enough for a loaded Redis across a data-centre network, short enough that
// a dead one costs a request little.
const DefaultTimeout = 100 * time.Millisecond

// DefaultPrefix starts every key the store writes when Config.Prefix is empty.
const DefaultPrefix = "weir"

// Config says how to reach Redis. ParseURL builds one from a URL.
type Config struct {
	// Addrs are "host:port" addresses. One address means a standalone
	// server (or, if it is a cluster node, that cluster); several mean a
	// Redis Cluster, unless MasterName is set, in which case they are the
	// Sentinels.
	Addrs []string
	// MasterName, when set, selects Sentinel: the store follows the master
	// of this name that the Sentinels at Addrs monitor, across failovers.
	MasterName string
	// Username and Password authenticate to the Redis servers (ACL user, or
	// only a password for requirepass).
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels,
	// if they require it.
	SentinelUsername, SentinelPassword string
	// DB is the database number; it must be 0 on a cluster.
	DB int
	// TLS, when not nil, makes every connection use TLS with this config.
	TLS *tls.Config
	// Timeout is the deadline of each store call; DefaultTimeout if zero.
	Timeout time.Duration
	// Prefix starts every key ("weir" if empty). It must not contain a
	// brace, which would break the hash tags.
	Prefix string

	// MaxInFlight is the most decision calls the store keeps out to a
	// standalone or Sentinel Redis at once (DefaultMaxInFlight if zero).
	// Decisions that come while all are out wait, and leave together in
	// one call when one returns, up to MaxBatch of them: under load Redis
	// then does much less work per decision, while under light load
	// nothing waits. See "Coalescing" in the package documentation.
	MaxInFlight int
	// MaxBatch is the most decisions one call carries (DefaultMaxBatch if
	// zero; at most 1000). 1 turns coalescing off: every decision is a
	// call of its own, sent at once however many are out, as on a Redis
	// Cluster.
	MaxBatch int

	// Clock, for tests only, replaces Redis TIME as the scripts' clock: the
	// store passes Clock's time to every script, so that a test can step
	// time exactly (storetest does). Keys still expire by Redis's real
	// clock. Never set it in production: instances would then decide by
	// their own clocks.
	Clock func() time.Time

	// evalOnly, for tests only, makes the store run EVAL scripts, as it does
	// on a Redis without Functions.
	evalOnly bool
}

// Store is the Redis store. It implements weir.Store and weir.MultiStore
// and is safe for concurrent use. Build it with New and Close it when done.
type Store struct {
	client  rueidis.Client
	cluster bool
	timeout time.Duration
	prefix  string
	clock   func() time.Time

	uidBase string        // random per store: member ids are uidBase + counter
	uidSeq  atomic.Uint64 // counter of member ids

	notRunRetries atomic.Int64 // calls re-sent after a refusal that ran nothing (tests report it)

	// Scripts run as functions of the library (FCALL) while functions is
	// true, as EVALSHA scripts otherwise: when Redis lacks Functions or the
	// ACL forbids loading them. libGen counts library loads, so that of many
	// calls that found the library missing only one reloads it.
	functions atomic.Bool
	libMu     sync.Mutex
	libGen    atomic.Uint64
	libLoads  atomic.Int64 // successful library loads (tests report it)

	// coalesce queues single decisions behind the calls in flight; nil
	// on a cluster or with a MaxBatch of 1.
	coalesce *coalescer

	limitsMu sync.Mutex
	limits   atomic.Pointer[map[weir.Limit]*compiled] // copy on write
}

// compiled is a Limit with its algorithm constants and their ARGV form,
// computed once per Limit.
type compiled struct {
	p       algorithm.Params
	maxCost int64
	algo    string // the algorithm name, the state key's suffix
	args    [nLimitArgs]string
}

// maxBatchLimit bounds Config.MaxBatch: a call's keys and arguments stay
// far below Lua's stack limit on unpack, and one call holds Redis for a
// few milliseconds at most.
const maxBatchLimit = 1000

// maxCachedLimits bounds the compiled-limit cache; limits beyond it are
// compiled on every call.
const maxCachedLimits = 4096

// New connects to Redis as cfg says and returns a Store. It fails if no
// server can be reached before ctx is done.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("redisstore: no address given")
	}
	for _, a := range cfg.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("redisstore: address %q: want host:port", a)
		}
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q must not contain a brace", cfg.Prefix)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("redisstore: negative timeout %v", cfg.Timeout)
	}
	if cfg.MaxBatch < 0 || cfg.MaxBatch > maxBatchLimit {
		return nil, fmt.Errorf("redisstore: batch size %d out of range 1..%d", cfg.MaxBatch, maxBatchLimit)
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("redisstore: negative calls in flight %d", cfg.MaxInFlight)
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redisstore: negative database number %d", cfg.DB)
	}
	clusterAsked := len(cfg.Addrs) > 1 && cfg.MasterName == ""
	if clusterAsked && cfg.DB != 0 {
		return nil, fmt.Errorf("redisstore: database %d requested, but a Redis Cluster only has database 0", cfg.DB)
	}
	s := &Store{timeout: cfg.Timeout, prefix: cfg.Prefix, clock: cfg.Clock}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	var nonce [9]byte
	_, _ = rand.Read(nonce[:])
	s.uidBase = base64.RawURLEncoding.EncodeToString(nonce[:]) + "."
	empty := map[weir.Limit]*compiled{}
	s.limits.Store(&empty)

	opt := rueidis.ClientOption{
		InitAddress:  cfg.Addrs,
		Username:     cfg.Username,
		Password:     cfg.Password,
		SelectDB:     cfg.DB,
		TLSConfig:    cfg.TLS,
		ClientName:   "weir",
		DisableCache: true, // no client-side caching: every decision is a script
		Dialer:       net.Dialer{Timeout: 2 * time.Second, KeepAlive: time.Second},
	}
	if cfg.MasterName != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet:               cfg.MasterName,
			Username:                cfg.SentinelUsername,
			Password:                cfg.SentinelPassword,
			TLSConfig:               cfg.TLS,
			Dialer:                  opt.Dialer,
			TopologyRefreshInterval: 5 * time.Second,
		}
	}
	type made struct {
		c   rueidis.Client
		err error
	}
	done := make(chan made, 1)
	go func() {
		c, err := rueidis.NewClient(opt)
		done <- made{c, err}
	}()
	var m made
	select {
	case m = <-done:
	case <-ctx.Done():
		go func() { // close the client if it turns up after all
			if m := <-done; m.c != nil {
				m.c.Close()
			}
		}()
		return nil, fmt.Errorf("%w: connect to %s: %w", weir.ErrStore, strings.Join(cfg.Addrs, ","), ctx.Err())
	}
	if m.err != nil {
		return nil, fmt.Errorf("%w: connect to %s: %w", weir.ErrStore, strings.Join(cfg.Addrs, ","), m.err)
	}
	s.client = m.c
	s.cluster = m.c.Mode() == rueidis.ClientModeCluster
	if clusterAsked && !s.cluster {
		m.c.Close()
		return nil, fmt.Errorf("redisstore: %d addresses given (%s) but they are not a Redis Cluster", len(cfg.Addrs), strings.Join(cfg.Addrs, ","))
	}
	if !s.cluster && cfg.MaxBatch != 1 {
		s.coalesce = &coalescer{s: s, inFlight: cfg.MaxInFlight, maxBatch: cfg.MaxBatch}
		if s.coalesce.inFlight == 0 {
			s.coalesce.inFlight = DefaultMaxInFlight
		}
		if s.coalesce.maxBatch == 0 {
			s.coalesce.maxBatch = DefaultMaxBatch
		}
	}
	// Load the library now, so the first decisions need not. If this fails
	// for a passing reason, the first FCALL that finds no library loads it.
	s.functions.Store(!cfg.evalOnly)
	if !cfg.evalOnly {
		_ = s.loadLibrary(ctx) // on failure, the first FCALL that finds no library tries again
	}
	return s, nil
}

// Timeout returns the deadline the store gives each call (Config.Timeout,
// or DefaultTimeout). Every call ends by it, or by the caller's deadline
// if sooner, so a caller need not set a deadline of its own:
// policy.Guard skips its timer for a store whose Timeout is no longer than
// the Guard's.
func (s *Store) Timeout() time.Duration { return s.timeout }

// Scripting reports how the store runs its Lua: "functions" (the weir
// library, called with FCALL) or "eval" (EVALSHA scripts, on a Redis
// without Functions or whose ACL forbids FUNCTION LOAD).
func (s *Store) Scripting() string {
	if s.functions.Load() {
		return "functions"
	}
	return "eval"
}

// loadLibrary loads the library on every primary the client knows. A
// library already there (same name, so same code) counts as loaded, and a
// replica's READONLY refusal is skipped: replicas get functions by
// replication. If Redis has no Functions, or the ACL forbids FUNCTION LOAD,
// the store switches to EVAL scripts and loadLibrary returns nil.
func (s *Store) loadLibrary(ctx context.Context) error {
	var firstErr error
	loaded := false
	for addr, node := range s.client.Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().FunctionCode(lib.src).Build()).Error()
		re, isRedis := rueidis.IsRedisErr(err)
		switch {
		case err == nil || isRedis && strings.Contains(re.Error(), "already exists"):
			loaded = true
		case isRedis && noFunctions(re):
			s.functions.Store(false)
			return nil
		case isRedis && strings.HasPrefix(re.Error(), "READONLY"):
		default:
			if firstErr == nil {
				firstErr = fmt.Errorf("FUNCTION LOAD %s on %s: %w", lib.name, addr, err)
			}
		}
	}
	if loaded {
		s.libLoads.Add(1)
	}
	return firstErr
}

// reloadLibrary loads the library after a call found it missing (a Redis
// restarted without persistence, FUNCTION FLUSH, a new cluster node),
// unless another call has reloaded it since gen.
func (s *Store) reloadLibrary(ctx context.Context, gen uint64) error {
	s.libMu.Lock()
	defer s.libMu.Unlock()
	if s.libGen.Load() != gen {
		return nil
	}
	err := s.loadLibrary(ctx)
	s.libGen.Add(1)
	return err
}

// noFunctions reports a refusal that means Functions cannot be used here:
// a Redis before 7.0 (unknown command), or an ACL that forbids the command.
func noFunctions(e *rueidis.RedisError) bool {
	msg := e.Error()
	return strings.HasPrefix(msg, "ERR unknown command") || strings.HasPrefix(msg, "ERR unknown subcommand") ||
		strings.HasPrefix(msg, "NOPERM")
}

// fcallRefused reports a refusal of FCALL itself, before anything ran: an
// unknown command (a Redis before 7.0 after all, say after a failover to
// an old replica) or an ACL without it. A refusal of a command inside the
// function is not one of these: it names that command, and the function
// may have run up to it.
func fcallRefused(e *rueidis.RedisError) bool {
	msg := strings.ToLower(e.Error())
	return strings.Contains(msg, "'fcall'") && (strings.HasPrefix(msg, "err unknown command") || strings.HasPrefix(msg, "noperm"))
}

// functionMissing reports FCALL's refusal when the library is not loaded.
func functionMissing(e *rueidis.RedisError) bool {
	return strings.Contains(e.Error(), "Function not found")
}

// Close closes the store's connections.
func (s *Store) Close() error {
	s.client.Close()
	return nil
}

// compile returns l's constants, from the cache when l was seen before.
func (s *Store) compile(l weir.Limit) (*compiled, error) {
	if c := (*s.limits.Load())[l]; c != nil {
		return c, nil
	}
	p, err := l.Compile()
	if err != nil {
		return nil, err
	}
	c := &compiled{p: p, maxCost: p.MaxCost(), algo: p.Kind.String(), args: limitArgs(&p)}
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	old := *s.limits.Load()
	if len(old) < maxCachedLimits {
		m := make(map[weir.Limit]*compiled, len(old)+1)
		for k, v := range old {
			m[k] = v
		}
		m[l] = c
		s.limits.Store(&m)
	}
	return c, nil
}

// nowArg is the scripts' clock argument: empty, so that they read Redis
// TIME, unless a test clock is set.
func (s *Store) nowArg() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock().UnixMicro(), 10)
}

// memberID returns the id under which an admitted request's sliding-log
// entries or concurrency slots are stored: the lease for a named lease, a
// fresh unique id otherwise.
func (s *Store) memberID(c *compiled, n int64, lease string) string {
	switch {
	case n == 0:
		return ""
	case c.p.Kind == algorithm.Concurrency && lease != "":
		return lease
	case c.p.Kind == algorithm.Concurrency || c.p.Kind == algorithm.SlidingLog:
		return s.uidBase + strconv.FormatUint(s.uidSeq.Add(1), 36)
	}
	return ""
}

func modeArg(m algorithm.Mode) string {
	if m == algorithm.AtMost {
		return "1"
	}
	return "0"
}

// Take implements weir.Store.
func (s *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	d, _, err := s.take(ctx, key, l, n, algorithm.Exact, "")
	if err != nil {
		return weir.Result{}, err
	}
	return weir.ResultOf(d), nil
}

// take runs the per-algorithm script and returns its decision and the µs
// time it decided at.
func (s *Store) take(ctx context.Context, key string, l weir.Limit, n int64, mode algorithm.Mode, lease string) (algorithm.Decision, int64, error) {
	c, err := s.compile(l)
	if err != nil {
		return algorithm.Decision{}, 0, err
	}
	if mode == algorithm.AtMost {
		n = min(n, c.maxCost) // a partial grant may ask for more than fits
	}
	if err := weir.CheckCost(key, n, c.maxCost); err != nil {
		return algorithm.Decision{}, 0, err
	}
	k := s.names(key, c.algo)
	id := s.memberID(c, n, lease)
	if s.coalesce != nil {
		vals, err := s.takeCoalesced(ctx, c, k, n, mode, id)
		if err != nil {
			return algorithm.Decision{}, 0, fmt.Errorf("%w: take %d from key %s under %s %v: %w", weir.ErrStore, n, quoteKey(key), c.algo, l, err)
		}
		return decodeDecision(vals[:]), vals[8], nil
	}
	keys := [2]string{k.state, k.block}
	var args [4 + nLimitArgs]string
	args[0], args[1], args[2], args[3] = s.nowArg(), strconv.FormatInt(n, 10), modeArg(mode), id
	copy(args[4:], c.args[:])
	var buf [9]int64
	vals, err := s.eval(ctx, &takeRoutines[c.p.Kind], keys[:], args[:], buf[:0])
	if err == nil && len(vals) != 9 {
		err = fmt.Errorf("unexpected reply of %d values", len(vals))
	}
	if err != nil {
		return algorithm.Decision{}, 0, fmt.Errorf("%w: take %d from key %s under %s %v: %w", weir.ErrStore, n, quoteKey(key), c.algo, l, err)
	}
	return decodeDecision(vals), vals[8], nil
}

// decodeDecision reads the eight values that the scripts' put() writes.
func decodeDecision(v []int64) algorithm.Decision {
	return algorithm.Decision{
		Allowed:      v[0] == 1,
		Granted:      v[1],
		Limit:        v[2],
		Remaining:    v[3],
		RetryAfter:   v[4],
		ResetAfter:   v[5],
		Delay:        v[6],
		BlockedUntil: v[7],
	}
}

// quoteKey quotes a key for an error message, shortened when long.
func quoteKey(key string) string {
	if len(key) > 100 {
		return strconv.Quote(key[:100]) + fmt.Sprintf("… (%d bytes)", len(key))
	}
	return strconv.Quote(key)
}

// withDeadline applies the store's timeout unless ctx ends sooner.
func (s *Store) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// eval runs r as call does and appends its reply, an array of integers,
// to dst.
func (s *Store) eval(ctx context.Context, r *routine, keys, args []string, dst []int64) ([]int64, error) {
	arr, err := s.call(ctx, r, keys, args)
	if err != nil {
		return nil, err
	}
	for i := range arr {
		v, err := arr[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("reply value %d: %w", i, err)
		}
		dst = append(dst, v)
	}
	return dst, nil
}

// call runs r, as an FCALL of the library or by EVALSHA, under the store's
// timeout and returns its reply, an array. See the package documentation
// for what is retried; nothing that may have run is. A missing library or
// script ran nothing either: it is loaded (once) and the call sent again.
func (s *Store) call(ctx context.Context, r *routine, keys, args []string) ([]rueidis.RedisMessage, error) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	sendSource, reloaded := false, false
	backoff := time.Millisecond
	for {
		fn := s.functions.Load()
		gen := s.libGen.Load()
		var cmd rueidis.Completed
		switch {
		case fn:
			cmd = s.client.B().Fcall().Function(r.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		case sendSource:
			cmd = s.client.B().Eval().Script(r.script.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		default:
			cmd = s.client.B().Evalsha().Sha1(r.script.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		}
		arr, err := s.client.Do(ctx, cmd).ToArray()
		if err == nil {
			return arr, nil
		}
		if re, ok := rueidis.IsRedisErr(err); ok {
			switch {
			case fn && functionMissing(re) && !reloaded:
				reloaded = true
				if err := s.reloadLibrary(ctx, gen); err != nil {
					return nil, fmt.Errorf("%w (after %w)", err, re)
				}
				continue
			case fn && fcallRefused(re):
				s.functions.Store(false) // no Functions here after all: EVALSHA
				continue
			case !fn && re.IsNoScript() && !sendSource:
				sendSource = true // not run: send the source, which also loads it
				continue
			}
		}
		if err = s.retryable(ctx, err, &backoff); err != nil {
			return nil, err
		}
	}
}

// retryable returns nil, after a backoff, when err is a refusal that ran
// nothing and the deadline leaves time to try again; otherwise it returns
// the error to give up with.
func (s *Store) retryable(ctx context.Context, err error, backoff *time.Duration) error {
	re, ok := rueidis.IsRedisErr(err)
	if !ok || !notRun(re) {
		return err // network, timeout: the command may have run
	}
	s.notRunRetries.Add(1)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (last reply: %w)", ctx.Err(), err)
	case <-t.C:
	}
	*backoff = min(2**backoff, 16*time.Millisecond)
	return nil
}

// notRun reports the error replies with which Redis refuses a script
// without running any of it, so that sending it again cannot consume twice.
func notRun(e *rueidis.RedisError) bool {
	if e.IsTryAgain() || e.IsClusterDown() || e.IsLoading() {
		return true
	}
	// A script's first write on a replica fails; every script writes
	// before it has changed anything (the first write is the first change).
	msg := e.Error()
	return strings.HasPrefix(msg, "READONLY") || strings.HasPrefix(msg, "MASTERDOWN")
}

// Reset implements weir.Store: it deletes key's state under l and its
// penalty box.
func (s *Store) Reset(ctx context.Context, key string, l weir.Limit) error {
	kind, ok := l.Algorithm.Kind()
	if !ok {
		return l.Validate()
	}
	k := s.names(key, kind.String())
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	backoff := time.Millisecond
	for {
		err := s.client.Do(ctx, s.client.B().Del().Key(k.state, k.block).Build()).Error()
		if err == nil {
			return nil
		}
		if err = s.retryable(ctx, err, &backoff); err != nil {
			return fmt.Errorf("%w: reset key %s under %s: %w", weir.ErrStore, quoteKey(key), kind, err)
		}
	}
}

// Release implements weir.MultiStore: it gives back the concurrency lease
// with id lease held on key. Releasing an unknown or expired lease, or under
// another algorithm, does nothing.
func (s *Store) Release(ctx context.Context, key string, l weir.Limit, lease string) error {
	kind, ok := l.Algorithm.Kind()
	if !ok {
		return l.Validate()
	}
	if kind != algorithm.Concurrency || lease == "" {
		return nil
	}
	k := s.names(key, kind.String())
	var buf [1]int64
	if _, err := s.eval(ctx, &releaseRoutine, []string{k.state}, []string{lease}, buf[:0]); err != nil {
		return fmt.Errorf("%w: release lease %q on key %s: %w", weir.ErrStore, lease, quoteKey(key), err)
	}
	return nil
}

// TTL returns how long Redis will keep key's state under l, the longest of
// the state's and the penalty box's PTTL, and whether either exists. A key
// without a TTL, which the store never writes, reports the largest
// duration. storetest uses it to check expiry.
func (s *Store) TTL(key string, l weir.Limit) (time.Duration, bool) {
	kind, ok := l.Algorithm.Kind()
	if !ok {
		return 0, false
	}
	k := s.names(key, kind.String())
	ctx, cancel := context.WithTimeout(context.Background(), 5*s.timeout)
	defer cancel()
	var ttl time.Duration
	found := false
	for _, name := range []string{k.state, k.block} {
		v, err := s.client.Do(ctx, s.client.B().Pttl().Key(name).Build()).AsInt64()
		switch {
		case err != nil || v == -2:
			continue
		case v == -1:
			return math.MaxInt64, true
		}
		found = true
		ttl = max(ttl, time.Duration(v)*time.Millisecond)
	}
	return ttl, found
}

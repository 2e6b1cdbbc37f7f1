// Package redisstore is weir's Redis store: many weir instances share one
// limit through Redis 7 or Valkey, standalone, under Sentinel, or as a Redis
// Cluster.
//
// Every decision is one Lua call that runs atomically inside Redis: it reads
// the clock with Redis TIME, runs the same integer math as package
// algorithm, writes the key's new state with a TTL, and returns the whole
// Result in one reply. The clock is Redis's, so application servers whose
// clocks disagree still decide alike. On Redis 7 and Valkey the Lua is one
// Redis Functions library named by the hash of its code, loaded by New and
// called with FCALL; elsewhere the same code runs by EVALSHA. Under load,
// decisions that find Config.MaxInFlight calls out wait and leave together
// in one call, each still exactly the decision it would get alone. Refusals
// that ran nothing (TRYAGAIN, READONLY...) are retried until the deadline; a
// timeout is never replayed, since the script may have run.
//
// New connects as a Config says (ParseURL builds one from a redis:// URL);
// NewWithClient runs on a rueidis client of the caller's, which it never
// closes. The Store implements weir.Store; Client
// lends its Redis client for other commands. docs/internals.md explains the scripts,
// coalescing, the key layout, cluster batches, retries and reconnection;
// docs/operations.md covers running Redis for weir.
package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/override"
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
	// A new connection's TCP dial may take the larger of it and 2s, and a
	// connection waits the larger of it and 10s for answers before it is
	// taken for dead: a store given a long Timeout for a loaded host does
	// not fail calls that wait for a connection the host is slow to set
	// up or to answer on.
	Timeout time.Duration
	// Prefix starts every key ("weir" if empty). It must not contain a
	// brace, which would break the hash tags.
	Prefix string

	// MaxInFlight is the most decision calls the store keeps out to a
	// standalone or Sentinel Redis at once (DefaultMaxInFlight if zero).
	// Decisions that come while all are out wait, and leave together in
	// one call when one returns, up to MaxBatch of them: under load Redis
	// then does much less work per decision, while under light load
	// nothing waits. See "Coalescing" in docs/internals.md.
	MaxInFlight int
	// MaxBatch is the most decisions one call carries (DefaultMaxBatch if
	// zero; at most 1000). 1 turns coalescing off: every decision is a
	// call of its own, sent at once however many are out, as on a Redis
	// Cluster.
	MaxBatch int
	// Linger, if above zero, makes a decision that finds a call free wait
	// up to this long for others to go with it, instead of leaving alone
	// at once: fewer, bigger calls, which cost Redis less per decision (a
	// call's fixed price is several decisions' worth), for up to Linger
	// more latency. A call that is full (MaxBatch decisions) leaves at
	// once. At most MaxLinger; 0 (the default) never waits. It has no
	// effect with a MaxBatch of 1.
	Linger time.Duration

	// Clock, for tests only, replaces Redis TIME as the scripts' clock: the
	// store passes Clock's time to every script, so that a test can step
	// time exactly (storetest does). Keys still expire by Redis's real
	// clock. Never set it in production: instances would then decide by
	// their own clocks.
	Clock func() time.Time

	// Lazy makes New return a store even when no server answers: the store
	// then connects in the background, retrying with a backoff of up to 5
	// s, and until it has, every call fails at once with an error wrapping
	// weir.ErrStore (Connected reports it). Setting up (the topology, the
	// Functions library) happens on the first connection. Without Lazy,
	// New fails when it cannot connect.
	Lazy bool
	// Logger, if set, receives the store's rare events: connected in the
	// background, reconnecting after READONLY.
	Logger *slog.Logger

	// Overrides makes every decision read the key's override, if any
	// (SetOverride; override.go), in the same script as its state: one
	// more GET inside the script per decision.
	Overrides bool

	// evalOnly, for tests only, makes the store run EVAL scripts, as it does
	// on a Redis without Functions.
	evalOnly bool
	// dial, for tests only, replaces the dialer (to play a DNS name that
	// moves to another server); client counts the clients the store made.
	dial func(ctx context.Context, addr string, client int64) (net.Conn, error)
}

// Store is the Redis store. It implements weir.Store and is safe for concurrent use. Build it with New and Close it when done.
type Store struct {
	client     *swapClient
	conn       conn
	cluster    bool // set before conn.connected, read after it
	standalone bool // one address, not Sentinel nor a cluster: READONLY means a demoted primary
	timeout    time.Duration
	prefix     string
	clock      func() time.Time
	// boundsClock, for tests, replaces the clock by which argOf picks a
	// calendar limit's window bounds (calendar.go), without changing the
	// clock the scripts read.
	boundsClock func() time.Time

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
	// nodes does the same on a cluster, one queue per primary (nodes.go);
	// nil elsewhere or with a MaxBatch of 1.
	nodes *nodeQueues

	limitsMu sync.Mutex
	limits   atomic.Pointer[map[weir.Limit]*compiled] // copy on write

	onRefund atomic.Pointer[func(context.Context, string)] // OnRefund's f

	overrides bool                              // Config.Overrides
	patterns  atomic.Pointer[override.Patterns] // pattern overrides (override.go)
	evts      atomic.Pointer[evState]           // rules with events (events.go); nil: none
	ovrMax    int                               // the bound on overrides, if not override.MaxOverrides (tests)
	ovrIdx    string                            // ovrIndex's name
}

// compiled is a Limit with its algorithm constants and their ARGV form,
// computed once per Limit.
type compiled struct {
	p       algorithm.Params
	maxCost int64
	algo    string   // the algorithm name, the state key's suffix
	arg     string   // the limit packed in one ARGV value (limitArg)
	cal     calCache // a calendar limit's ARGV of the current window (calendar.go)
}

// maxBatchLimit bounds Config.MaxBatch: a call's keys and arguments stay
// far below Lua's stack limit on unpack, and one call holds Redis for a
// few milliseconds at most.
const maxBatchLimit = 1000

// maxCachedLimits bounds the compiled-limit cache; limits beyond it are
// compiled on every call.
const maxCachedLimits = 4096

// New connects to Redis as cfg says and returns a Store. It fails if no
// server can be reached before ctx is done. The store owns its client:
// Close closes it. NewWithClient builds a store on a client of yours.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("redisstore: no address given")
	}
	for _, a := range cfg.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("redisstore: address %q: want host:port", a)
		}
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redisstore: negative database number %d", cfg.DB)
	}
	clusterAsked := len(cfg.Addrs) > 1 && cfg.MasterName == ""
	if clusterAsked && cfg.DB != 0 {
		return nil, fmt.Errorf("redisstore: database %d requested, but a Redis Cluster only has database 0", cfg.DB)
	}
	s, err := newStore(&cfg)
	if err != nil {
		return nil, err
	}
	opt := rueidis.ClientOption{
		InitAddress:  slices.Clone(cfg.Addrs), // the client reads it on every topology refresh: never the caller's slice
		Username:     cfg.Username,
		Password:     cfg.Password,
		SelectDB:     cfg.DB,
		TLSConfig:    cfg.TLS,
		ClientName:   "weir",
		DisableCache: true, // no client-side caching: every decision is a script
		Dialer:       net.Dialer{Timeout: max(2*time.Second, s.timeout), KeepAlive: time.Second},
		// rueidis's default (KeepAlive × 10) would close a connection
		// whose answers take 10s, failing calls whose Timeout is longer.
		ConnWriteTimeout: max(10*time.Second, s.timeout),
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
	s.conn = conn{opt: opt, dial: cfg.dial, addrs: strings.Join(cfg.Addrs, ","), clusterAsked: clusterAsked, log: cfg.Logger, stop: make(chan struct{})}
	s.client = &swapClient{}
	s.client.swap(closedClient())
	if err := s.connect(ctx, &cfg); err != nil {
		if !cfg.Lazy || !errors.Is(err, weir.ErrStore) {
			return nil, err
		}
		go s.connectLoop(cfg)
	}
	return s, nil
}

// NewWithClient returns a Store that sends its calls over client, a
// rueidis client you made and own, as go-redis/redis_rate takes its
// caller's client: one connection pool serves the limiter and the rest of
// your program. NewWithClient loads the store's scripts over client before
// it returns (within ctx). The store never closes client, nor replaces
// it: Close only stops the store, whose calls then fail, and you close
// client when everything using it is done. Following a primary that moves
// is then client's job (use Sentinel or Cluster, or dial it again
// yourself).
//
// Of cfg, only what does not say how to connect applies: Timeout, Prefix,
// MaxInFlight, MaxBatch, Clock and Logger. Addrs, MasterName, the
// credentials, DB, TLS and Lazy belong to client's own options; setting
// any of them is an error. Give client DisableCache if it serves nothing
// else: the store makes no cached calls.
func NewWithClient(ctx context.Context, client rueidis.Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: NewWithClient with a nil client")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Addrs", len(cfg.Addrs) > 0}, {"MasterName", cfg.MasterName != ""},
		{"Username", cfg.Username != ""}, {"Password", cfg.Password != ""},
		{"SentinelUsername", cfg.SentinelUsername != ""}, {"SentinelPassword", cfg.SentinelPassword != ""},
		{"DB", cfg.DB != 0}, {"TLS", cfg.TLS != nil}, {"Lazy", cfg.Lazy},
	} {
		if f.set {
			return nil, fmt.Errorf("redisstore: NewWithClient: Config.%s is set, but the client says how to connect; set it in the client's options", f.name)
		}
	}
	s, err := newStore(&cfg)
	if err != nil {
		return nil, err
	}
	addrs := make([]string, 0, len(client.Nodes()))
	for a := range client.Nodes() {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	s.conn = conn{addrs: strings.Join(addrs, ","), log: cfg.Logger, stop: make(chan struct{}), borrowed: true}
	s.client = &swapClient{}
	s.client.swap(closedClient())
	if err := s.setup(ctx, client, &cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// newStore checks the settings of cfg that do not say how to connect and
// returns a store with them, not yet connected.
func newStore(cfg *Config) (*Store, error) {
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
	if cfg.Linger < 0 || cfg.Linger > MaxLinger {
		return nil, fmt.Errorf("redisstore: linger %v out of range 0..%v", cfg.Linger, MaxLinger)
	}
	s := &Store{timeout: cfg.Timeout, prefix: cfg.Prefix, clock: cfg.Clock, overrides: cfg.Overrides}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	s.ovrIdx = s.prefix + ":{overrides}"
	var nonce [9]byte
	_, _ = rand.Read(nonce[:])
	s.uidBase = base64.RawURLEncoding.EncodeToString(nonce[:]) + "."
	empty := map[weir.Limit]*compiled{}
	s.limits.Store(&empty)
	return s, nil
}

// Timeout returns the deadline the store gives each call (Config.Timeout,
// or DefaultTimeout). Every call ends by it, or by the caller's deadline
// if sooner, so a caller need not set a deadline of its own:
// guard.Guard skips its timer for a store whose Timeout is no longer than
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
		case isRedis && isReadOnly(re):
			if s.standalone {
				s.readOnly() // a demoted primary without the library
			}
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

// Close closes the store's connections. A store built by NewWithClient
// leaves its client open (it is the caller's) and stops using it: the
// store's calls fail from then on.
func (s *Store) Close() error {
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	if !s.conn.closed {
		s.conn.closed = true
		close(s.conn.stop)
		if s.conn.borrowed {
			s.client.swap(closedClient())
		} else {
			s.client.Close()
		}
	}
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
	c := &compiled{p: p, maxCost: p.MaxCost(), algo: p.Kind.String(), arg: limitArg(&p)}
	if s.overrides {
		// The scripts read the key's override (prelude.lua's override_of).
		// The limit's shape: an override applies only to a limit of the
		// same (override.Shape).
		if !strings.HasSuffix(c.arg, "|") {
			c.arg += ";"
		}
		c.arg += "o=" + override.Shape(l)
	}
	c.algo = stateAlgo(p.Kind, l)
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
	return strconv.Itoa(int(m)) // 0 exact, 1 at most, 2 debit, 3 credit, 4 settle: prelude.lua's modes
}

// takenArg is the member-id argument of a settlement (mode 4): the take it
// settles, as prelude.lua's parse_taken reads it.
func takenArg(st weir.Stamp) string {
	return strconv.FormatInt(st.At, 10) + ":" + strconv.FormatInt(st.Estimate, 10) + ":" + strconv.FormatInt(st.Remaining, 10)
}

// Take implements weir.Store.
func (s *Store) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	req := weir.Request{Key: key, Limit: l, N: n}
	d, _, err := s.take(ctx, &req)
	if err != nil {
		return weir.Result{}, err
	}
	return weir.ResultOf(d), nil
}

// take runs the per-algorithm script for req (a take, at-most take,
// debit or refund), checked by Request.CheckWith once its limit is
// compiled, and returns its decision and the µs time it decided at.
func (s *Store) take(ctx context.Context, req *weir.Request) (algorithm.Outcome, int64, error) {
	key, n, mode, l := req.Key, req.N, req.AlgorithmMode(), req.Limit
	if s.overrides {
		l = s.patterned(key, l)
	}
	c, err := s.compile(l)
	if err != nil {
		return algorithm.Outcome{}, 0, err
	}
	if err := req.CheckWith(&c.p); err != nil {
		return algorithm.Outcome{}, 0, err
	}
	if !s.conn.connected.Load() {
		return algorithm.Outcome{}, 0, fmt.Errorf("%w: take %d from %s under %s %v: %w", weir.ErrStore, n, keyRef(key), c.algo, req.Limit, s.notConnectedError())
	}
	if mode == algorithm.AtMost {
		n = min(n, c.maxCost) // a partial grant may ask for more than fits
	}
	k := s.names(key, c.algo)
	id := s.memberID(c, n, req.Lease)
	if mode == algorithm.Settle {
		// A settlement's refund: the take it settles rides in the
		// member-id argument (take.lua), not a member.
		id = takenArg(req.Stamp)
	}
	q := s.coalesce
	if s.nodes != nil && s.functions.Load() {
		q = s.nodes.queue(k.tag) // nil until the store knows the slot's node
	}
	var vals [9]int64
	var er *redisEvRule
	if e := s.evts.Load(); e != nil {
		if r, ok := e.rules[events.RuleOf(key)]; ok {
			er = &r
		}
	}
	if er != nil {
		vals, err = s.takeEvents(ctx, c, k, key, events.RuleOf(key), er, n, mode, id)
	} else if q != nil {
		vals, err = s.takeCoalesced(ctx, q, c, k, n, mode, id)
	} else {
		vals, err = s.takeAlone(ctx, c, [2]string{k.state, k.block}, n, mode, id)
	}
	if err != nil {
		if s.overrides {
			if cerr := costError(err, key, n, nil); cerr != err {
				return algorithm.Outcome{}, 0, cerr
			}
		}
		return algorithm.Outcome{}, 0, fmt.Errorf("%w: take %d from %s under %s %v: %w", weir.ErrStore, n, keyRef(key), c.algo, l, err)
	}
	return decodeDecision(vals[:]), vals[8], nil
}

// takeAlone makes one decision in a call of its own and returns its eight
// values and the clock reading it was made at.
func (s *Store) takeAlone(ctx context.Context, c *compiled, keys [2]string, n int64, mode algorithm.Mode, id string) ([9]int64, error) {
	args := [5]string{s.nowArg(), strconv.FormatInt(n, 10), modeArg(mode), id, s.argOf(c)}
	var buf [9]int64
	vals, err := s.eval(ctx, &takeRoutines[c.p.Kind], keys[:], args[:], buf[:0])
	if err == nil && len(vals) != 9 {
		err = fmt.Errorf("unexpected reply of %d values", len(vals))
	}
	if err != nil {
		return [9]int64{}, err
	}
	return buf, nil
}

// decodeDecision reads the eight values that the scripts' put() writes.
func decodeDecision(v []int64) algorithm.Outcome {
	return algorithm.Outcome{
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

// keyRef names a key in an error message without its identity: a state
// key is weir.Key's "rule:identity", and the identity may be an API key or
// another secret that must not reach a log line. keyRef gives the rule (the
// key's first part, shortened when long) and the first 8 bytes of the key's
// SHA-256, as in `rule "login" key#3f2a…`: enough to tell keys apart and
// to match a suspected key (hash it), never enough to read one.
func keyRef(key string) string {
	sum := sha256.Sum256([]byte(key))
	ref := "key#" + hex.EncodeToString(sum[:8])
	rule, _, ok := strings.Cut(key, ":")
	if !ok {
		return ref // no rule part: the whole key may be the secret
	}
	if len(rule) > 64 {
		rule = rule[:64] + "…"
	}
	return "rule " + strconv.Quote(rule) + " " + ref
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
// timeout and returns its reply, an array. docs/internals.md ("Failures
// and retries") says what is retried; nothing that may have run is. A missing library or
// script ran nothing either: it is loaded (once) and the call sent again.
func (s *Store) call(ctx context.Context, r *routine, keys, args []string) ([]rueidis.RedisMessage, error) {
	if !s.conn.connected.Load() {
		return nil, s.notConnectedError()
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		// A batch whose earliest deadline passed on its way here.
		return nil, notSent{fmt.Errorf("not sent: %w: the deadline passed before the call left for Redis", context.DeadlineExceeded)}
	}
	sendSource, reloaded := false, false
	rs := retries{backoff: time.Millisecond}
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
			if s.conn.roSince.Load() != 0 {
				s.conn.roSince.Store(0)
			}
			return arr, nil
		}
		if re, ok := rueidis.IsRedisErr(err); ok {
			if s.standalone && isReadOnly(re) {
				s.readOnly()
			}
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
		if err = s.retryable(ctx, err, &rs); err != nil {
			return nil, err
		}
	}
}

// retries is the retry state of one call: the backoff before its next
// attempt and the last refusal that ran nothing, if any.
type retries struct {
	backoff time.Duration
	last    error
}

// retryable returns nil, after a backoff, when err is a refusal that ran
// nothing and the deadline leaves time to try again; otherwise it returns
// the error to give up with. An error that ends a call after such a
// refusal names it too: a deadline that cuts a retry short in flight then
// still says why the call was being retried (READONLY, LOADING...).
func (s *Store) retryable(ctx context.Context, err error, rs *retries) error {
	re, ok := rueidis.IsRedisErr(err)
	if !ok || !notRun(re) {
		err = giveUp(ctx, err)
		if rs.last != nil {
			err = fmt.Errorf("%w (after a refusal that ran nothing: %v)", err, rs.last)
		}
		return err
	}
	rs.last = err
	s.notRunRetries.Add(1)
	t := time.NewTimer(rs.backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (last reply: %w)", ctx.Err(), err)
	case <-t.C:
		// The deadline may have passed all the same (both ready, or the
		// context's own timer not run yet): then give up with the reply,
		// not with a call that cannot leave.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return fmt.Errorf("%w (last reply: %w)", context.DeadlineExceeded, err)
		}
	}
	rs.backoff = min(2*rs.backoff, 16*time.Millisecond)
	return nil
}

// giveUp returns err, a failure that may have run (network, timeout),
// as the call gives up with it. A network error that came because the
// deadline passed (a dial or read cut short by it) is a timeout, and says
// so. The socket's own deadline (a dial, a read) can fire a moment before
// the context's timer marks the context done, so the clock is asked too.
func giveUp(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", err, context.DeadlineExceeded)
	}
	return err
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

// reset deletes key's state under l and its penalty box (weir.ModeReset).
func (s *Store) reset(ctx context.Context, key string, l weir.Limit) error {
	kind, ok := l.Algorithm.Kind()
	if !ok {
		return l.Validate()
	}
	k := s.names(key, stateAlgo(kind, l))
	if !s.conn.connected.Load() {
		return fmt.Errorf("%w: reset %s under %s: %w", weir.ErrStore, keyRef(key), kind, s.notConnectedError())
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	rs := retries{backoff: time.Millisecond}
	for {
		var err error
		if s.evts.Load() != nil && !s.cluster {
			err = s.resetEvents(ctx, key, k)
		} else {
			err = s.client.Do(ctx, s.client.B().Del().Key(k.state, k.block).Build()).Error()
		}
		if err == nil {
			return nil
		}
		if err = s.retryable(ctx, err, &rs); err != nil {
			return fmt.Errorf("%w: reset %s under %s: %w", weir.ErrStore, keyRef(key), kind, err)
		}
	}
}

// release gives back the concurrency lease with id lease held on key
// (weir.ModeRelease). Releasing an unknown or expired lease, or under
// another algorithm, does nothing.
func (s *Store) release(ctx context.Context, key string, l weir.Limit, lease string) error {
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
		return fmt.Errorf("%w: release lease %q on %s: %w", weir.ErrStore, lease, keyRef(key), err)
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
	k := s.names(key, stateAlgo(kind, l))
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

// stateAlgo names l's state key's algorithm: its own, with "+warmup" for a
// warm-up, which counts in other units and so keeps a state of its own
// (warmup.lua).
func stateAlgo(k algorithm.Kind, l weir.Limit) string {
	if l.Warmup > 0 {
		return k.String() + "+warmup"
	}
	return k.String()
}

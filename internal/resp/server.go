// Package resp serves weir's decisions over the Redis protocol (RESP2 and
// RESP3), so that Redis clients call them as commands:
//
//	CL.THROTTLE key max_burst count_per_period period [quantity]   redis-cell's command
//	GCRA key max_burst tokens_per_period period [TOKENS n]         the GCRA command of Redis
//	WEIR.CHECK rule key [hits]                                     a rule of weir.yaml
//	WEIR.RESERVE rule key estimate [TIER tier]                     POST /v1/reserve
//	WEIR.SETTLE reservation actual                                 POST /v1/settle
//
// with the commands client libraries send when they connect (PING, AUTH,
// HELLO, CLIENT, SELECT 0, COMMAND, QUIT). The decisions are made by a
// Backend, which weir serve provides over its store.
//
// A connection's commands are answered in order; the decisions of a
// pipeline are sent to the backend together, so that they share the
// store's batching with every other connection's. Everything a
// connection can make the server hold is bounded (Limits); a stream that
// does not parse, or passes a bound, gets a RESP error and the connection
// is closed.
package resp

import (
	"bufio"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"hash/maphash"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir"
)

// Backend makes the decisions of the RESP commands. It must be safe for
// concurrent use.
type Backend interface {
	// Take decides n events for key under l and consumes them if they are
	// admitted, as weir.Store.Take does, for CL.THROTTLE and GCRA (command
	// names which, in lower case). The backend keeps these keys apart from
	// those of its rules.
	Take(ctx context.Context, command, key string, l weir.Limit, n int64) (weir.Result, error)
	// Check decides hits for key under the named rule, as weir serve's
	// POST /v1/check does. An error's text is sent to the client.
	Check(ctx context.Context, rule, key string, hits int64) (CheckResult, error)
	// Reserve takes estimate for key under the named rule (tier "" for
	// its default) and, when admitted, keeps a reservation to settle, as
	// weir serve's POST /v1/reserve does.
	Reserve(ctx context.Context, rule, tier, key string, estimate int64) (ReserveResult, error)
	// Settle charges the difference between reservation id's estimate and
	// actual, once, as POST /v1/settle does.
	Settle(ctx context.Context, id string, actual int64) (CheckResult, error)
}

// ReserveResult is a reservation's decision, for WEIR.RESERVE:
// Reservation is the id to settle, "" when refused.
type ReserveResult struct {
	CheckResult
	Reservation string
	ExpiresIn   time.Duration
}

// CheckResult is a rule's decision, for WEIR.CHECK.
type CheckResult struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// Limits bound what one client can make the server hold or do. A zero
// field takes its default.
type Limits struct {
	// MaxConns is the most connections open at once; a client past it is
	// answered "-ERR max number of clients reached" and closed. Default
	// 1024.
	MaxConns int
	// MaxArgs is the most arguments in one command, its name included.
	// Default 32.
	MaxArgs int
	// MaxBulk is the longest argument, in bytes. Default 8 KiB.
	MaxBulk int
	// MaxPipeline is the most commands of one connection read ahead and
	// decided at once; the rest wait in the socket. Default 256.
	MaxPipeline int
	// IdleTimeout closes a connection that sends nothing this long.
	// Default 5 minutes.
	IdleTimeout time.Duration
	// WriteTimeout closes a connection that does not read its replies
	// within this long. Default 30 seconds.
	WriteTimeout time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxConns     = 1024
	DefaultMaxArgs      = 32
	DefaultMaxBulk      = 8 << 10
	DefaultMaxPipeline  = 256
	DefaultIdleTimeout  = 5 * time.Minute
	DefaultWriteTimeout = 30 * time.Second
)

// maxPipelineBytes bounds the bytes of the commands read ahead at once on
// one connection.
const maxPipelineBytes = 1 << 20

func (l *Limits) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxConns, DefaultMaxConns)
	def(&l.MaxArgs, DefaultMaxArgs)
	def(&l.MaxBulk, DefaultMaxBulk)
	def(&l.MaxPipeline, DefaultMaxPipeline)
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
}

// Config configures a Server.
type Config struct {
	// Token, when set, must be given with AUTH (or HELLO's AUTH) before
	// any other command.
	Token string
	// TLS, when set, makes the listener speak TLS only.
	TLS *tls.Config
	// Limits bound each connection.
	Limits Limits
	// Logger logs what goes wrong; default slog.Default().
	Logger *slog.Logger
	// InTurn says that the backend never waits (an in-process store): a
	// pipeline's decisions are then made in turn on the connection's
	// goroutine, which costs less than handing them to others. Otherwise
	// they are decided at once, so that they share the store's batches.
	InTurn bool
}

// Server serves the RESP commands on listeners.
type Server struct {
	b     Backend
	cfg   Config
	log   *slog.Logger
	slots chan struct{}

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup
	nextID atomic.Int64

	work    chan task // hands a pipeline's key group to an idle worker
	workers atomic.Int64
	seed    maphash.Seed // of the key groups' hashes
}

// NewServer returns a Server deciding with b.
func NewServer(b Backend, cfg Config) *Server {
	cfg.Limits.fill()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{b: b, cfg: cfg, log: cfg.Logger, slots: make(chan struct{}, cfg.Limits.MaxConns),
		lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, work: make(chan task), seed: maphash.MakeSeed()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("resp: server closed")

// Serve accepts connections on l until Shutdown or Close, and returns
// ErrServerClosed then.
func (s *Server) Serve(l net.Listener) error {
	if s.cfg.TLS != nil {
		l = tls.NewListener(l, s.cfg.TLS)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.lns[l] = struct{}{}
	s.mu.Unlock()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, errTemporary) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		select {
		case s.slots <- struct{}{}:
		default:
			_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = nc.Write(appendError(nil, "ERR max number of clients reached"))
			nc.Close()
			continue
		}
		c := &conn{s: s, nc: nc, id: s.nextID.Add(1), proto: 2, authed: s.cfg.Token == ""}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			<-s.slots
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

var errTemporary = errors.New("temporary")

// Shutdown stops accepting, lets each connection finish the commands it
// has read and closes it, and waits for them until ctx ends; then it
// closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for l := range s.lns {
		l.Close()
	}
	for c := range s.conns {
		c.stop() // wakes a connection blocked reading
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for l := range s.lns {
		l.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.cancel()
	return nil
}

// conn is one client connection.
type conn struct {
	s       *Server
	nc      net.Conn
	id      int64
	proto   int
	authed  bool
	name    string
	stopped atomic.Bool

	// The pipeline being answered (serve, run), kept from one to the next
	// so that a connection's steady state allocates nothing of its own.
	args   argBuf
	batch  []pending
	ctx    context.Context  // the deadline of the pipeline's decisions
	groups map[uint64]int32 // a key group's hash: its last command so far
	heads  []int32          // the first command of each key group
	wg     sync.WaitGroup   // the key groups out on workers
}

// stop makes the connection end after the commands it has read.
func (c *conn) stop() {
	c.stopped.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// pending is one command of a pipeline and its reply.
type pending struct {
	args  [][]byte
	reply []byte // kept, emptied, for the next pipeline's command here
	next  int32  // the next command of its key group, or -1
	kind  kind   // a decision's command
	quit  bool
}

// maxKeptReply is the largest reply buffer a connection keeps for its
// next pipeline: a decision's reply fits, and MaxPipeline of them stay
// small.
const maxKeptReply = 256

func (c *conn) serve() {
	s := c.s
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("weir: RESP connection failed", "remote", c.nc.RemoteAddr().String(), "panic", p)
		}
		c.nc.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		<-s.slots
		s.wg.Done()
	}()
	lim := &s.cfg.Limits
	r := bufio.NewReaderSize(c.nc, maxLine)
	w := bufio.NewWriterSize(c.nc, 16<<10)
	c.groups = make(map[uint64]int32)
	for {
		if c.stopped.Load() {
			return
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
		if c.stopped.Load() {
			return
		}
		c.args.reset()
		var readErr error
		n, bytes := 0, 0
		for {
			args, m, err := readCommand(r, lim, &c.args)
			bytes += m
			if err != nil {
				readErr = err
				break
			}
			if len(args) > 0 {
				if n == len(c.batch) {
					c.batch = append(c.batch, pending{})
				}
				p := &c.batch[n]
				p.args, p.reply, p.quit = args, p.reply[:0], false
				n++
			}
			if r.Buffered() == 0 || n >= lim.MaxPipeline || bytes >= maxPipelineBytes {
				break
			}
		}
		batch := c.batch[:n]
		quit := c.run(batch)
		_ = c.nc.SetWriteDeadline(time.Now().Add(lim.WriteTimeout))
		for i := range batch {
			if _, err := w.Write(batch[i].reply); err != nil {
				return
			}
			if batch[i].quit {
				quit = true
				break
			}
		}
		for i := range batch {
			batch[i].args = nil
			if cap(batch[i].reply) > maxKeptReply {
				batch[i].reply = nil
			}
		}
		var pe *ProtocolError
		if !quit && errors.As(readErr, &pe) {
			_, _ = w.Write(appendError(nil, "ERR "+pe.Error()))
			quit = true
		}
		if err := w.Flush(); err != nil || quit || readErr != nil {
			return
		}
	}
}

// run answers a pipeline: the commands that change the connection's
// state (AUTH, HELLO...) in order, once the decisions before them are
// done; between them, decisions at once, one key group at a time each,
// so that decisions on one key are made in the order sent. The groups go
// to workers but one, which the connection's goroutine decides itself;
// the pipeline's decisions share one deadline. It reports whether the
// connection must close.
func (c *conn) run(batch []pending) bool {
	defer func() { c.ctx = nil }()
	for i := range batch {
		p := &batch[i]
		if c.authed {
			if k := decisionKind(p.args[0]); k != kindNone {
				if c.ctx == nil {
					ctx, cancel := context.WithTimeout(c.s.ctx, decisionTimeout)
					defer cancel()
					c.ctx = ctx
				}
				p.kind = k
				if c.s.cfg.InTurn {
					p.reply = c.decide(c.ctx, k, p.args, p.reply[:0])
					continue
				}
				c.group(batch, int32(i))
				continue
			}
		}
		c.flush(batch)
		p.reply, p.quit = c.command(p.args, p.reply[:0])
		if p.quit {
			for j := i + 1; j < len(batch); j++ {
				batch[j].reply = batch[j].reply[:0]
			}
			return true
		}
	}
	c.flush(batch)
	return false
}

// group adds decision i to its key group: the key, or WEIR.CHECK's rule,
// by a hash of it. Two keys of one hash share a group, which only orders
// their decisions.
func (c *conn) group(batch []pending, i int32) {
	var h uint64
	if args := batch[i].args; len(args) > 1 {
		h = maphash.Bytes(c.s.seed, args[1])
	}
	batch[i].next = -1
	if last, ok := c.groups[h]; ok {
		batch[last].next = i
	} else {
		c.heads = append(c.heads, i)
	}
	c.groups[h] = i
}

// flush decides the key groups gathered so far and waits for them.
func (c *conn) flush(batch []pending) {
	if len(c.heads) == 0 {
		return
	}
	last := len(c.heads) - 1
	c.wg.Add(last)
	for _, h := range c.heads[:last] {
		c.s.goDecide(task{c, h})
	}
	c.decideGroup(batch, c.heads[last])
	c.wg.Wait()
	clear(c.groups)
	c.heads = c.heads[:0]
}

// decideGroup decides the key group that starts at command i, in order.
func (c *conn) decideGroup(batch []pending, i int32) {
	for ; i >= 0; i = batch[i].next {
		p := &batch[i]
		p.reply = c.decide(c.ctx, p.kind, p.args, p.reply[:0])
	}
}

// task is a key group of a pipeline for a worker: the group that starts
// at command head of c's batch.
type task struct {
	c    *conn
	head int32
}

// run decides the group and tells its connection.
func (t task) run() {
	defer t.c.wg.Done()
	t.c.decideGroup(t.c.batch, t.head)
}

// maxWorkers bounds the goroutines kept to decide the key groups of
// pipelines (goDecide).
const maxWorkers = 1024

// goDecide runs t, a key group of a pipeline, on an idle worker, or on a
// new goroutine that stays a worker while there are fewer than maxWorkers
// (past that, one that ends with t). A decision's call chain (backend,
// deny cache, guard, store) outgrows a new goroutine's stack, and copying
// it cost about a sixth of the CPU of a decision on Redis; a worker keeps
// its grown stack. Workers end when the server does.
func (s *Server) goDecide(t task) {
	select {
	case s.work <- t:
		return
	default:
	}
	if s.workers.Add(1) > maxWorkers {
		s.workers.Add(-1)
		go t.run()
		return
	}
	go s.worker(t)
}

// worker runs t, then the key groups goDecide hands it, until the server
// ends.
func (s *Server) worker(t task) {
	defer s.workers.Add(-1)
	for {
		t.run()
		select {
		case t = <-s.work:
		case <-s.ctx.Done():
			return
		}
	}
}

// checkToken compares a token given with AUTH in constant time.
func (c *conn) checkToken(user, pass []byte) bool {
	if user != nil && string(user) != "default" {
		return false
	}
	return subtle.ConstantTimeCompare(pass, []byte(c.s.cfg.Token)) == 1
}

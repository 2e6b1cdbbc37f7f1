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

	work    chan func() // hands a pipeline's key group to an idle worker
	workers atomic.Int64
}

// NewServer returns a Server deciding with b.
func NewServer(b Backend, cfg Config) *Server {
	cfg.Limits.fill()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{b: b, cfg: cfg, log: cfg.Logger, slots: make(chan struct{}, cfg.Limits.MaxConns),
		lns: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, work: make(chan func())}
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
}

// stop makes the connection end after the commands it has read.
func (c *conn) stop() {
	c.stopped.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// pending is one command of a pipeline and its reply.
type pending struct {
	args  [][]byte
	reply []byte
	quit  bool
}

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
	batch := make([]pending, 0, 16)
	for {
		if c.stopped.Load() {
			return
		}
		_ = c.nc.SetReadDeadline(time.Now().Add(lim.IdleTimeout))
		if c.stopped.Load() {
			return
		}
		batch = batch[:0]
		var readErr error
		bytes := 0
		for {
			args, n, err := readCommand(r, lim)
			bytes += n
			if err != nil {
				readErr = err
				break
			}
			if len(args) > 0 {
				batch = append(batch, pending{args: args})
			}
			if r.Buffered() == 0 || len(batch) >= lim.MaxPipeline || bytes >= maxPipelineBytes {
				break
			}
		}
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
// done; between them, decisions at once, one goroutine per key, so that
// decisions on one key are made in the order sent. It reports whether the
// connection must close.
func (c *conn) run(batch []pending) bool {
	var wg sync.WaitGroup
	groups := map[string][]int{}
	flush := func() {
		for _, idx := range groups {
			wg.Add(1)
			c.s.goDecide(func() {
				defer wg.Done()
				for _, i := range idx {
					batch[i].reply = c.decide(batch[i].args, batch[i].reply[:0])
				}
			})
		}
		clear(groups)
		wg.Wait()
	}
	for i := range batch {
		p := &batch[i]
		if c.authed && isDecision(p.args[0]) {
			k := "" // the key, or WEIR.CHECK's rule: in order within it
			if len(p.args) > 1 {
				k = string(p.args[1])
			}
			groups[k] = append(groups[k], i)
			continue
		}
		flush()
		p.reply, p.quit = c.command(p.args, p.reply[:0])
		if p.quit {
			for j := i + 1; j < len(batch); j++ {
				batch[j].reply = nil
			}
			return true
		}
	}
	flush()
	return false
}

// maxWorkers bounds the goroutines kept to decide the key groups of
// pipelines (goDecide).
const maxWorkers = 1024

// goDecide runs f, a key group of a pipeline, on an idle worker, or on a
// new goroutine that stays a worker while there are fewer than maxWorkers
// (past that, one that ends with f). A decision's call chain (backend,
// deny cache, guard, store) outgrows a new goroutine's stack, and copying
// it cost about a sixth of the CPU of a decision on Redis; a worker keeps
// its grown stack. Workers end when the server does.
func (s *Server) goDecide(f func()) {
	select {
	case s.work <- f:
		return
	default:
	}
	if s.workers.Add(1) > maxWorkers {
		s.workers.Add(-1)
		go f()
		return
	}
	go s.worker(f)
}

// worker runs f, then the key groups goDecide hands it, until the server
// ends.
func (s *Server) worker(f func()) {
	defer s.workers.Add(-1)
	for {
		f()
		select {
		case f = <-s.work:
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

// Package redistest starts real redis-server processes for tests.
//
// Every server runs on a free loopback port (127.0.0.1, never the default
// 6379) with its own temporary directory, no persistence, and is killed when
// the test that created it ends (via t.Cleanup). On Linux the processes also
// receive SIGKILL if the test binary itself dies, so they never outlive it.
// Tests therefore only ever talk to Redis instances they started themselves.
//
// Three topologies are available:
//
//	s := redistest.Standalone(t)   // one server; s.Addr is "127.0.0.1:port"
//	c := redistest.Cluster(t)      // 3 primaries, all 16384 slots, state ok
//	g := redistest.Sentinel(t)     // primary + replica + 3 sentinels ("weirtest")
//
// Outages can be simulated with Server.Kill (crash), Server.Stop (graceful
// shutdown) and Server.Start (restart on the same port), slot migrations with
// ClusterGroup.MigrateSlot and failovers with SentinelGroup.Failover.
// Server.Do sends a raw command using a small built-in RESP2 client, so the
// package needs nothing beyond the standard library.
//
// If redis-server is not on PATH the constructors call t.Skip, unless the
// environment variable CI is non-empty, in which case they call t.Fatal so
// that a misconfigured CI cannot silently skip Redis-backed tests.
package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	readyTimeout = 15 * time.Second // process start until PING answers PONG
	stopTimeout  = 15 * time.Second // graceful stop before falling back to SIGKILL
	groupTimeout = 20 * time.Second // cluster / sentinel convergence
	pollInterval = 25 * time.Millisecond
	startRetries = 5 // new ports to try when a fresh server's port was taken
)

// Available reports whether redis-server is on PATH.
func Available() bool {
	_, err := redisServerPath()
	return err == nil
}

var redisServerPath = sync.OnceValues(func() (string, error) {
	return exec.LookPath("redis-server")
})

// requireRedis skips (or, under CI, fails) the test when redis-server is
// missing and returns its path otherwise.
func requireRedis(t testing.TB) string {
	t.Helper()
	path, err := redisServerPath()
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("redistest: redis-server not found on PATH (%v); CI is set, so Redis-backed tests must not be skipped: install redis-server (7.0+)", err)
	}
	t.Skipf("redistest: redis-server not found on PATH (%v); skipping Redis-backed test", err)
	return ""
}

// Ports handed out by this process are never handed out again, so two
// servers of the same test binary cannot race for the same port, and a
// stopped server keeps its port for Start.
var (
	portMu        sync.Mutex
	reservedPorts = map[int]bool{}
)

// freePort returns a currently free loopback port. With bus set, port+10000
// (the cluster bus port) is free too and port < 55535.
func freePort(bus bool) (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	var rejected []net.Listener
	defer func() {
		for _, l := range rejected {
			l.Close()
		}
	}()
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p == 6379 || reservedPorts[p] || (bus && (p >= 55535 || reservedPorts[p+10000])) {
			rejected = append(rejected, l) // keep it open so :0 does not return it again
			continue
		}
		if bus {
			lb, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
			if err != nil {
				rejected = append(rejected, l)
				continue
			}
			lb.Close()
			reservedPorts[p+10000] = true
		}
		l.Close()
		reservedPorts[p] = true
		return p, nil
	}
	return 0, errors.New("redistest: could not find a free loopback port")
}

// Server is one redis-server (or sentinel) process started by this package.
// Its methods are safe for concurrent use. Methods that fail fatally (Start)
// use the testing.TB the server was created with, so call them from that
// test's goroutine.
type Server struct {
	// Addr is the "127.0.0.1:port" address the server listens on. It stays
	// the same across Stop/Kill/Start.
	Addr string

	t       testing.TB
	name    string // for messages: "redis", "cluster node", "sentinel", ...
	bin     string
	dir     string
	args    []string
	logPath string // redis log file (--logfile)
	outPath string // captured stdout/stderr of the process

	running atomic.Bool

	procMu sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has been waited for

	connMu sync.Mutex
	conn   *respConn

	tls      *tls.Config // the helper's own connections use TLS with this, if set
	password string      // and authenticate with this, if set
}

// argsFunc builds the redis-server arguments for a server on port with its
// own directory dir (it may write files there, e.g. a sentinel config).
type argsFunc func(port int, dir string) ([]string, error)

func baseArgs(port int, dir string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"),
		// Replicas sync at once instead of after the default 5s
		// diskless-sync delay.
		"--repl-diskless-sync-delay", "0",
	}
}

// newServer creates, starts and registers cleanup for one server. If the
// process cannot bind its port (taken by someone else between picking and
// binding), it retries on new ports. Failure is fatal.
func newServer(t testing.TB, name string, bus bool, build argsFunc) *Server {
	t.Helper()
	return newServerTLS(t, name, bus, build, nil)
}

// newServerTLS is newServer for a server that speaks TLS only: the
// helper's own connections (readiness, Do) use clientTLS.
func newServerTLS(t testing.TB, name string, bus bool, build argsFunc, clientTLS *tls.Config) *Server {
	t.Helper()
	return newServerAuth(t, name, bus, build, clientTLS, "")
}

// newServerAuth is newServerTLS for a server that may also require a
// password, which the helper's own connections then give.
func newServerAuth(t testing.TB, name string, bus bool, build argsFunc, clientTLS *tls.Config, password string) *Server {
	t.Helper()
	bin := requireRedis(t)
	var lastErr error
	for range startRetries {
		port, err := freePort(bus)
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		dir := t.TempDir() // before t.Cleanup below, so the dir is removed after the kill
		args, err := build(port, dir)
		if err != nil {
			t.Fatalf("redistest: %s: %v", name, err)
		}
		s := &Server{
			Addr:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			t:        t,
			name:     name,
			bin:      bin,
			dir:      dir,
			args:     args,
			logPath:  filepath.Join(dir, "redis.log"),
			outPath:  filepath.Join(dir, "stdout.log"),
			tls:      clientTLS,
			password: password,
		}
		t.Cleanup(s.cleanup)
		lastErr = s.start()
		if lastErr == nil {
			return s
		}
		if !strings.Contains(lastErr.Error(), "Address already in use") {
			break
		}
	}
	t.Fatalf("redistest: %v", lastErr)
	return nil
}

// Standalone starts a standalone redis-server on a free loopback port and
// stops it when the test ends. It skips the test if redis-server is not on
// PATH (fails instead when the CI environment variable is set).
func Standalone(t testing.TB) *Server {
	t.Helper()
	return newServer(t, "redis", false, func(port int, dir string) ([]string, error) {
		return baseArgs(port, dir), nil
	})
}

func (s *Server) cleanup() {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	s.killLocked()
}

// Start starts the server again on the same port (and with the same
// directory and configuration) after Stop or Kill, and waits until it answers
// PING. It does nothing if the server is running. Failure is fatal to the
// test that created the server.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

func (s *Server) start() error {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	if s.cmd != nil {
		select {
		case <-s.done: // exited on its own: reap and restart
			s.cmd, s.done = nil, nil
			s.running.Store(false)
		default:
			return nil
		}
	}
	s.closeConn()

	out, err := os.OpenFile(s.outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	out.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("start %s on %s: %v", s.name, s.Addr, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done

	if err := s.waitReady(); err != nil {
		s.killLocked()
		return fmt.Errorf("%s on %s did not become ready: %v\n%s", s.name, s.Addr, err, s.logTail())
	}
	s.running.Store(true)
	return nil
}

// waitReady polls PING until it answers PONG, the process exits, or
// readyTimeout passes.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	var last error
	for {
		select {
		case <-s.done:
			return fmt.Errorf("process exited: %v", s.cmd.ProcessState)
		default:
		}
		c, err := s.dial(time.Second)
		if err == nil {
			var v any
			v, err = c.do(2*time.Second, "PING")
			c.Close()
			if err == nil && v == "PONG" {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("PING replied %v", v)
			}
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v (last error: %v)", readyTimeout, last)
		}
		time.Sleep(pollInterval)
	}
}

// dial connects the helper to the server, authenticated if it needs it.
func (s *Server) dial(timeout time.Duration) (*respConn, error) {
	c, err := dialRESP(s.Addr, timeout, s.tls)
	if err != nil || s.password == "" {
		return c, err
	}
	if _, err := c.do(2*time.Second, "AUTH", s.password); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Stop shuts the server down gracefully (SIGTERM; with persistence disabled
// this is a SHUTDOWN NOSAVE) and waits for the process to exit. Only if it
// has not exited after 15s is it killed. Stop is idempotent.
func (s *Server) Stop() {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	if s.cmd == nil {
		return
	}
	s.running.Store(false)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err == nil {
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
		}
	}
	s.killLocked()
}

// Kill sends SIGKILL to the server (simulating a crash) and waits for the
// process to exit. Kill is idempotent.
func (s *Server) Kill() {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	s.running.Store(false)
	if s.cmd != nil {
		_ = s.cmd.Process.Kill() // an error means it already exited
		<-s.done
		s.cmd, s.done = nil, nil
	}
	s.closeConn()
}

func (s *Server) closeConn() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

// Do sends one command to the server over a cached connection (dialled on
// first use and after any network error) and returns the reply: string for
// simple and bulk strings, int64 for integers, []any for arrays, nil for null
// replies. An error reply is returned as an Error; inside arrays error
// elements are Error values. Each command has a 15s deadline. Do fails
// without connecting if the server is stopped, so it never reaches some
// other process that may have taken the port.
func (s *Server) Do(args ...string) (any, error) {
	if len(args) == 0 {
		return nil, errors.New("redistest: Do: no command")
	}
	if !s.running.Load() {
		return nil, fmt.Errorf("redistest: %s on %s is not running", s.name, s.Addr)
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn == nil {
		c, err := s.dial(dialTimeout)
		if err != nil {
			return nil, err
		}
		s.conn = c
	}
	v, err := s.conn.do(commandTimeout, args...)
	var rerr Error
	if err != nil && !errors.As(err, &rerr) {
		s.conn.Close()
		s.conn = nil
	}
	return v, err
}

// doString runs a command whose reply must be a string.
func (s *Server) doString(args ...string) (string, error) {
	v, err := s.Do(args...)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", s.Addr, strings.Join(args, " "), err)
	}
	str, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s %s: unexpected reply %#v", s.Addr, strings.Join(args, " "), v)
	}
	return str, nil
}

// infoField returns field from INFO section ("" if absent).
func (s *Server) infoField(section, field string) (string, error) {
	info, err := s.doString("INFO", section)
	if err != nil {
		return "", err
	}
	return lineValue(info, field), nil
}

// lineValue finds "key:value" in a CRLF-separated INFO-style text.
func lineValue(text, key string) string {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return v
		}
	}
	return ""
}

// logTail returns the last lines of the server log and captured output.
func (s *Server) logTail() string {
	var b strings.Builder
	for _, p := range []string{s.logPath, s.outPath} {
		data, err := os.ReadFile(p)
		if err != nil || len(strings.TrimSpace(string(data))) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		fmt.Fprintf(&b, "--- tail of %s ---\n%s\n", p, strings.Join(lines, "\n"))
	}
	if b.Len() == 0 {
		return "(server log is empty)"
	}
	return b.String()
}

// waitFor polls cond every pollInterval until it returns nil or timeout
// passes, returning the last error.
// waitForGroup waits up to groupTimeout for cond to report nil, else fails t
// with failure, cond's last error and the log tails of servers.
func waitForGroup(t testing.TB, servers []*Server, cond func() error, failure string) {
	t.Helper()
	if err := waitFor(groupTimeout, cond); err != nil {
		var logs strings.Builder
		for _, s := range servers {
			logs.WriteString(s.logTail())
		}
		t.Fatalf("redistest: %s: %v\n%s", failure, err, logs.String())
	}
}

func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v: %w", timeout, err)
		}
		time.Sleep(pollInterval)
	}
}

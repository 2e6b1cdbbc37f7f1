package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// memBackend decides on a memstore, with one rule "api" of 3 per minute
// for WEIR.CHECK.
type memBackend struct {
	st    *memstore.Store
	takes atomic.Int64
	resv  sync.Map // reservation id: its estimate
	ids   atomic.Int64
}

// Reserve takes estimate under "api" and keeps a reservation when
// admitted; tier "gold" is the only tier.
func (b *memBackend) Reserve(ctx context.Context, rule, tier, key string, estimate int64) (ReserveResult, error) {
	if tier != "" && tier != "gold" {
		return ReserveResult{}, fmt.Errorf("rule %q has no tier %q", rule, tier)
	}
	res, err := b.Check(ctx, rule, key, estimate)
	if err != nil || !res.Allowed {
		return ReserveResult{CheckResult: res}, err
	}
	id := fmt.Sprintf("r%d", b.ids.Add(1))
	b.resv.Store(id, estimate)
	return ReserveResult{CheckResult: res, Reservation: id, ExpiresIn: time.Minute}, nil
}

// Settle answers the estimate less actual as remaining, once.
func (b *memBackend) Settle(ctx context.Context, id string, actual int64) (CheckResult, error) {
	est, ok := b.resv.LoadAndDelete(id)
	if !ok {
		return CheckResult{}, fmt.Errorf("reservation %q is unknown, expired or already settled", id)
	}
	return CheckResult{Allowed: true, Limit: 3, Remaining: est.(int64) - actual}, nil
}

func (b *memBackend) Take(ctx context.Context, command, key string, l weir.Limit, n int64) (weir.Result, error) {
	b.takes.Add(1)
	return b.st.Take(ctx, weir.Key("resp:gcra", key), l, n)
}

func (b *memBackend) Check(ctx context.Context, rule, key string, hits int64) (CheckResult, error) {
	if rule != "api" {
		return CheckResult{}, fmt.Errorf("no rule is named %q", rule)
	}
	res, err := b.st.Take(ctx, weir.Key(rule, key), weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Minute}, hits)
	if err != nil {
		return CheckResult{}, err
	}
	return CheckResult{Allowed: res.Allowed, Limit: res.Limit, Remaining: res.Remaining, RetryAfter: res.RetryAfter, ResetAfter: res.ResetAfter}, nil
}

func start(t testing.TB, cfg Config) (string, *memBackend) {
	t.Helper()
	b := &memBackend{st: memstore.New()}
	s := NewServer(b, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return l.Addr().String(), b
}

// raw sends in on a new connection and returns everything the server
// answers until it closes the connection or a second passes.
func raw(t testing.TB, addr, in string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, in); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	out, _ := io.ReadAll(c)
	return string(out)
}

func rueidisClient(t testing.TB, addr, token string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, Password: token})
	if err != nil {
		t.Fatalf("rueidis: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func do(t testing.TB, c rueidis.Client, args ...string) ([]int64, error) {
	t.Helper()
	return c.Do(context.Background(), c.B().Arbitrary(args[0]).Args(args[1:]...).Build()).AsIntSlice()
}

// TestThrottleTable checks CL.THROTTLE and GCRA against redis-cell's
// semantics: max_burst+1 at once, the five integers, quantity past the
// burst limited with no retry, quantity 0 a peek, bad arguments refused.
func TestThrottleTable(t *testing.T) {
	addr, _ := start(t, Config{})
	c := rueidisClient(t, addr, "")
	for _, cmd := range []string{"CL.THROTTLE", "GCRA"} {
		t.Run(cmd, func(t *testing.T) {
			k := "k-" + cmd
			args := func(key string, q string) []string {
				a := []string{cmd, key, "4", "1", "10"}
				if q == "" {
					return a
				}
				if cmd == "GCRA" {
					return append(a, "TOKENS", q)
				}
				return append(a, q)
			}
			cases := []struct {
				args []string
				want []int64
			}{
				{args(k, ""), []int64{0, 5, 4, -1, 10}},
				{args(k, "1"), []int64{0, 5, 3, -1, 20}},
				{args(k, "2"), []int64{0, 5, 1, -1, 40}},
				{args(k, "2"), []int64{1, 5, 1, 10, 40}},
				{args(k, "1"), []int64{0, 5, 0, -1, 50}},
				{args(k, "1"), []int64{1, 5, 0, 10, 50}},
				{args(k+"x", "6"), []int64{1, 5, 5, -1, 0}},
				{args(k+"y", "5"), []int64{0, 5, 0, -1, 50}},
			}
			if cmd == "CL.THROTTLE" {
				cases = append(cases, struct {
					args []string
					want []int64
				}{args(k, "0"), []int64{0, 5, 0, -1, 50}})
			}
			for i, tc := range cases {
				got, err := do(t, c, tc.args...)
				if err != nil {
					t.Fatalf("case %d %v: %v", i, tc.args, err)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("case %d %v: got %v, want %v", i, tc.args, got, tc.want)
				}
			}
		})
	}
	got, err := do(t, c, "GCRA", "half", "0", "2", "1.5")
	if err != nil || fmt.Sprint(got) != "[0 1 0 -1 1]" {
		t.Errorf("GCRA with a fractional period: %v, %v", got, err)
	}
	for _, bad := range [][]string{
		{"CL.THROTTLE", "k", "-1", "1", "10"},
		{"CL.THROTTLE", "k", "4", "0", "10"},
		{"CL.THROTTLE", "k", "4", "1", "0"},
		{"CL.THROTTLE", "k", "4", "1", "10", "-1"},
		{"CL.THROTTLE", "k", "99999999999999999999", "1", "10"},
		{"CL.THROTTLE", "k", "1099511627777", "1", "10"},
		{"CL.THROTTLE", "k", "4", "1", "999999999999"},
		{"CL.THROTTLE", "k", "4", "x", "10"},
		{"CL.THROTTLE", "k", "4", "1"},
		{"GCRA", "k", "4", "1", "10", "TOKENS", "0"},
		{"GCRA", "k", "4", "1", "10", "TOKENS"},
		{"GCRA", "k", "4", "1", "10", "COUNT", "1"},
		{"GCRA", "k", "4", "1", "-1"},
		{"GCRA", "k", "4", "1", "nan"},
		{"GCRA", "k", "-4", "1", "10"},
	} {
		var re *rueidis.RedisError
		if got, err := do(t, c, bad...); !errors.As(err, &re) {
			t.Errorf("%v: got %v, %v; want an ERR", bad, got, err)
		}
	}
}

// TestCheck checks WEIR.CHECK's reply and errors.
func TestCheck(t *testing.T) {
	addr, _ := start(t, Config{})
	c := rueidisClient(t, addr, "")
	for i, want := range []string{"[0 3 2 -1]", "[0 3 0 -1]", "[1 3 0]"} {
		a := []string{"WEIR.CHECK", "api", "u1"}
		if i == 1 {
			a = append(a, "2")
		}
		got, err := do(t, c, a...)
		if err != nil {
			t.Fatal(err)
		}
		// The times count down to the window's end.
		n := strings.Count(want, " ") + 1
		if fmt.Sprint(got[:n]) != want || got[4] <= 0 || got[4] > 60000 || got[0] == 1 && got[3] != got[4] {
			t.Errorf("call %d: got %v, want %s", i, got, want)
		}
	}
	if _, err := do(t, c, "WEIR.CHECK", "nope", "u1"); err == nil || !strings.Contains(err.Error(), "no rule") {
		t.Errorf("unknown rule: %v", err)
	}
	if _, err := do(t, c, "WEIR.CHECK", "api", "u1", "-1"); err == nil {
		t.Error("negative hits accepted")
	}
}

// TestReserveSettle checks WEIR.RESERVE's and WEIR.SETTLE's replies, a
// flat array of names and values in RESP2 and a map in RESP3, and their
// refusals of bad arguments, each naming the bad value.
func TestReserveSettle(t *testing.T) {
	addr, _ := start(t, Config{})
	// RESP2: a flat array; the refusal keeps no reservation.
	out := raw(t, addr, "WEIR.RESERVE api u1 2\r\nWEIR.RESERVE api u1 2 TIER gold\r\n")
	want := "*14\r\n$7\r\nallowed\r\n:1\r\n$5\r\nlimit\r\n:3\r\n$9\r\nremaining\r\n:1\r\n$14\r\nretry_after_ms\r\n:0\r\n"
	if !strings.HasPrefix(out, want) || !strings.Contains(out, "$11\r\nreservation\r\n$2\r\nr1\r\n$13\r\nexpires_in_ms\r\n:60000\r\n") ||
		!strings.Contains(out, "$7\r\nallowed\r\n:0\r\n") || !strings.Contains(out, "$11\r\nreservation\r\n$0\r\n\r\n") {
		t.Errorf("RESP2 replies:\n%q", out)
	}
	// RESP3 (rueidis): a map; settled once.
	c := rueidisClient(t, addr, "")
	ctx := context.Background()
	r, err := c.Do(ctx, c.B().Arbitrary("WEIR.RESERVE").Args("api", "u3", "3").Build()).AsMap()
	if err != nil {
		t.Fatal(err)
	}
	rid, al := r["reservation"], r["allowed"]
	id, _ := rid.ToString()
	if a, _ := al.AsInt64(); a != 1 || id == "" {
		t.Fatalf("RESP3 reserve: %v", r)
	}
	got, err := c.Do(ctx, c.B().Arbitrary("WEIR.SETTLE").Args(id, "1").Build()).AsIntMap()
	if err != nil || got["remaining"] != 2 || got["allowed"] != 1 || len(got) != 5 {
		t.Errorf("settle: %v %v", got, err)
	}
	if _, err := c.Do(ctx, c.B().Arbitrary("WEIR.SETTLE").Args(id, "1").Build()).AsIntMap(); err == nil || !strings.Contains(err.Error(), "already settled") {
		t.Errorf("settled twice: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"WEIR.RESERVE", "api", "u4"}, "wrong number of arguments for 'weir.reserve'"},
		{[]string{"WEIR.RESERVE", "api", "u4", "0"}, "estimate is out of range"},
		{[]string{"WEIR.RESERVE", "api", "u4", "x"}, "estimate is not an integer"},
		{[]string{"WEIR.RESERVE", "api", "u4", "1", "TEAR", "gold"}, "'TEAR' where TIER was expected"},
		{[]string{"WEIR.RESERVE", "api", "u4", "1", "TIER", "lead"}, `no tier "lead"`},
		{[]string{"WEIR.RESERVE", "nope", "u4", "1"}, `no rule is named "nope"`},
		{[]string{"WEIR.SETTLE", id}, "wrong number of arguments for 'weir.settle'"},
		{[]string{"WEIR.SETTLE", id, "-1"}, "actual is out of range"},
		{[]string{"WEIR.SETTLE", strings.Repeat("z", 65), "1"}, "is not an id WEIR.RESERVE answers"},
	} {
		err := c.Do(ctx, c.B().Arbitrary(tc.args[0]).Args(tc.args[1:]...).Build()).Error()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// TestHandshakeAndAuth runs the handshake commands, RESP2 and RESP3,
// with a token.
func TestHandshakeAndAuth(t *testing.T) {
	addr, _ := start(t, Config{Token: "s3cret-token-0123456789"})
	if out := raw(t, addr, "PING\r\n"); !strings.HasPrefix(out, "-NOAUTH") {
		t.Errorf("PING before AUTH: %q", out)
	}
	if out := raw(t, addr, "*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n"); !strings.HasPrefix(out, "-WRONGPASS") {
		t.Errorf("AUTH wrong: %q", out)
	}
	in := "*2\r\n$4\r\nAUTH\r\n$23\r\ns3cret-token-0123456789\r\n" +
		"PING\r\nCLIENT SETNAME me\r\nCLIENT GETNAME\r\nSELECT 0\r\nSELECT 1\r\nCOMMAND\r\nHELLO 3\r\nCLIENT GETNAME\r\nFLUSHALL\r\nQUIT\r\nPING\r\n"
	out := raw(t, addr, in)
	for _, want := range []string{"+OK\r\n+PONG\r\n+OK\r\n$2\r\nme\r\n+OK\r\n-ERR DB index", "*0\r\n%7\r\n", "$2\r\nme\r\n-ERR unknown command 'FLUSHALL'", "+OK\r\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("reply lacks %q:\n%s", want, out)
		}
	}
	if strings.HasSuffix(out, "+PONG\r\n") {
		t.Error("a command after QUIT was answered")
	}
	c := rueidisClient(t, addr, "s3cret-token-0123456789")
	if got, err := do(t, c, "CL.THROTTLE", "a", "0", "1", "1"); err != nil || got[0] != 0 {
		t.Errorf("after rueidis' handshake: %v %v", got, err)
	}
	if _, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, Password: "bad"}); err == nil {
		t.Error("rueidis connected with a wrong token")
	}
}

// TestBadStreams checks that malformed input and passed bounds get an
// error and a closed connection.
func TestBadStreams(t *testing.T) {
	addr, _ := start(t, Config{Limits: Limits{MaxArgs: 8, MaxBulk: 64}})
	for _, in := range []string{
		"*2\r\n$4\r\nPING\r\n:1\r\n",
		"*x\r\n",
		"*1\r\n$-5\r\n",
		"*9\r\n",
		"*1\r\n$65\r\n" + strings.Repeat("a", 65) + "\r\n",
		"*1\r\n$4\r\nPINGxx",
		strings.Repeat("a", maxLine+10),
	} {
		out := raw(t, addr, in)
		if !strings.HasPrefix(out, "-ERR Protocol error") {
			t.Errorf("%.40q: got %q", in, out)
		}
	}
	if out := raw(t, addr, "PING\r\n*9\r\n"); out != "+PONG\r\n-ERR Protocol error: 9 arguments in one command; at most 8\r\n" {
		t.Errorf("a good command then a bad one: %q", out)
	}
}

// TestMaxConns checks the bound on connections.
func TestMaxConns(t *testing.T) {
	addr, _ := start(t, Config{Limits: Limits{MaxConns: 1}})
	c1, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	io.WriteString(c1, "PING\r\n")
	line, _ := bufio.NewReader(c1).ReadString('\n')
	if line != "+PONG\r\n" {
		t.Fatalf("first connection: %q", line)
	}
	if out := raw(t, addr, "PING\r\n"); !strings.HasPrefix(out, "-ERR max number of clients") {
		t.Errorf("second connection: %q", out)
	}
}

// TestIdleTimeout checks that an idle connection is closed.
func TestIdleTimeout(t *testing.T) {
	addr, _ := start(t, Config{Limits: Limits{IdleTimeout: 100 * time.Millisecond}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("idle connection: %v, want EOF", err)
	}
}

// TestExactUnderPipelines hammers one key from many connections, each
// pipelining, and checks that exactly the limit is admitted.
func TestExactUnderPipelines(t *testing.T) {
	for _, inTurn := range []bool{false, true} {
		t.Run(fmt.Sprintf("InTurn=%v", inTurn), func(t *testing.T) {
			addr, _ := start(t, Config{InTurn: inTurn})
			ExactUnderPipelines(t, []string{addr}, 16, 20, 25)
		})
	}
}

// ExactUnderPipelines sends conns*pipes pipelines of depth commands of
// CL.THROTTLE on one key, spread over addrs, and checks that max_burst+1
// (a period of a day refills nothing) are admitted, no more, no less.
func ExactUnderPipelines(t testing.TB, addrs []string, conns, pipes, depth int) {
	const burst = 499
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addrs[i%len(addrs)])
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			cmd := fmt.Sprintf("*5\r\n$11\r\nCL.THROTTLE\r\n$3\r\nhot\r\n$3\r\n%d\r\n$1\r\n1\r\n$5\r\n86400\r\n", burst)
			for range pipes {
				if _, err := io.WriteString(c, strings.Repeat(cmd, depth)); err != nil {
					t.Error(err)
					return
				}
				for range depth {
					v, err := readReply(r)
					if err != nil {
						t.Error(err)
						return
					}
					switch v := v.(type) {
					case []int64:
						if len(v) != 5 {
							t.Errorf("reply %v; want 5 integers", v)
						} else if v[0] == 0 {
							admitted.Add(1)
						}
					default:
						// An error reply is one line: reading on keeps
						// the stream in step, so the next replies count.
						t.Errorf("reply %v; want 5 integers", v)
					}
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != burst+1 {
		t.Errorf("admitted %d of %d; want exactly %d", got, conns*pipes*depth, burst+1)
	}
}

func newFuzzStore() *memstore.Store { return memstore.New() }

// pipeConn is a net.Conn reading from r and writing into w.
type pipeConn struct {
	net.Conn
	r io.Reader
	w bytesBuffer
}

type bytesBuffer struct{ strings.Builder }

func (b *bytesBuffer) Bytes() []byte { return []byte(b.String()) }

func (c *pipeConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *pipeConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *pipeConn) Close() error                     { return nil }
func (c *pipeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *pipeConn) SetWriteDeadline(time.Time) error { return nil }
func (c *pipeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// replyError is an error reply, as readReply returns it.
type replyError string

// readReply reads one reply: a string (simple or bulk), a replyError, an
// int64, or an array of integers as []int64.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return nil, fmt.Errorf("bad reply line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return replyError(body), nil
	case ':':
		v, ok := parseInt([]byte(body))
		if !ok {
			return nil, fmt.Errorf("bad integer %q", line)
		}
		return v, nil
	case '$':
		n, ok := parseInt([]byte(body))
		if !ok || n < 0 {
			return nil, fmt.Errorf("bad bulk header %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, ok := parseInt([]byte(body))
		if !ok || n < 0 {
			return nil, fmt.Errorf("bad array header %q", line)
		}
		out := make([]int64, n)
		for i := range out {
			v, err := readReply(r)
			if err != nil {
				return nil, err
			}
			iv, ok := v.(int64)
			if !ok {
				return nil, fmt.Errorf("array element %d is %v; want an integer", i, v)
			}
			out[i] = iv
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown reply type %q", line)
}

// failingBackend fails the takes of keys that start with "fail".
type failingBackend struct{ *memBackend }

func (b failingBackend) Take(ctx context.Context, command, key string, l weir.Limit, n int64) (weir.Result, error) {
	if strings.HasPrefix(key, "fail") {
		return weir.Result{}, fmt.Errorf("%w: deadline exceeded", weir.ErrStore)
	}
	return b.memBackend.Take(ctx, command, key, l, n)
}

// TestPipelineWrittenBeforeRead writes far more commands than the server
// reads ahead (MaxPipeline) before reading any reply, with store errors
// and connection commands among the decisions: every command gets one
// reply, in order, and an error reply (one line) leaves the stream in
// step.
func TestPipelineWrittenBeforeRead(t *testing.T) {
	for _, inTurn := range []bool{false, true} {
		t.Run(fmt.Sprintf("InTurn=%v", inTurn), func(t *testing.T) { pipelineWrittenBeforeRead(t, inTurn) })
	}
}

func pipelineWrittenBeforeRead(t *testing.T, inTurn bool) {
	b := failingBackend{&memBackend{st: memstore.New()}}
	s := NewServer(b, Config{Limits: Limits{MaxPipeline: 8}, InTurn: inTurn})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	defer s.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const n = 20000 // 2,500 times MaxPipeline; about 1 MB of commands
	var want []string
	var in strings.Builder
	for i := range n {
		switch {
		case i%10 == 0:
			e := strconv.Itoa(i)
			fmt.Fprintf(&in, "*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n", len(e), e)
			want = append(want, e)
		case i%7 == 0:
			k := fmt.Sprintf("fail%d", i)
			fmt.Fprintf(&in, "*5\r\n$11\r\nCL.THROTTLE\r\n$%d\r\n%s\r\n$1\r\n0\r\n$1\r\n1\r\n$2\r\n60\r\n", len(k), k)
			want = append(want, "error")
		default:
			// Key i%3 under a burst of 1 a minute: the first take of
			// each key is admitted, every later one limited.
			k := fmt.Sprintf("k%d", i%3)
			fmt.Fprintf(&in, "*5\r\n$11\r\nCL.THROTTLE\r\n$%d\r\n%s\r\n$1\r\n0\r\n$1\r\n1\r\n$2\r\n60\r\n", len(k), k)
			if i < 3 || i < 6 && i%3 == 0 {
				want = append(want, "[0 1 0 -1 60]")
			} else {
				want = append(want, "limited")
			}
		}
	}
	// Write everything first; a reader starts only once the last byte is
	// written, so a server that stopped reading while its replies wait
	// would fail here (by the write deadline) rather than hang.
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, in.String()); err != nil {
		t.Fatalf("writing %d commands before reading: %v", n, err)
	}
	r := bufio.NewReader(c)
	for i, w := range want {
		v, err := readReply(r)
		if err != nil {
			t.Fatalf("reply %d of %d: %v", i, n, err)
		}
		got := fmt.Sprint(v)
		switch w {
		case "error":
			if e, ok := v.(replyError); !ok || !strings.Contains(string(e), "the store failed") {
				t.Fatalf("reply %d: %q; want the store's error", i, got)
			}
		case "limited":
			if a, ok := v.([]int64); !ok || len(a) != 5 || a[0] != 1 {
				t.Fatalf("reply %d: %q; want a limited decision", i, got)
			}
		default:
			if got != w {
				t.Fatalf("reply %d: %q; want %q", i, got, w)
			}
		}
	}
}

// TestWorkersEnd checks that the goroutines kept to decide pipelines are
// bounded while connections pipeline, and all end with the server.
func TestWorkersEnd(t *testing.T) {
	s := NewServer(&memBackend{st: memstore.New()}, Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	ExactUnderPipelines(t, []string{l.Addr().String()}, 8, 4, 50)
	// One key makes one key group, which the connection decides itself:
	// a pipeline over many keys puts its other groups on workers.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var in strings.Builder
	for i := range 50 {
		k := strconv.Itoa(i)
		fmt.Fprintf(&in, "*5\r\n$11\r\nCL.THROTTLE\r\n$%d\r\n%s\r\n$1\r\n0\r\n$1\r\n1\r\n$2\r\n60\r\n", len(k), k)
	}
	if _, err := io.WriteString(c, in.String()); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for i := range 50 {
		if v, err := readReply(r); err != nil || fmt.Sprint(v) != "[0 1 0 -1 60]" {
			t.Fatalf("reply %d: %v, %v; want [0 1 0 -1 60]", i, v, err)
		}
	}
	if n := s.workers.Load(); n < 1 || n > maxWorkers {
		t.Errorf("%d workers after the pipelines; want 1 to %d", n, maxWorkers)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for s.workers.Load() != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d workers still running after Shutdown", s.workers.Load())
		case <-time.After(time.Millisecond):
		}
	}
}

// jitterBackend waits a varying while before each take, as a store's
// round trips do, so that decisions made at once finish out of order.
type jitterBackend struct {
	*memBackend
	n atomic.Int64
}

func (b *jitterBackend) Take(ctx context.Context, command, key string, l weir.Limit, n int64) (weir.Result, error) {
	time.Sleep(time.Duration(b.n.Add(7)%5) * 100 * time.Microsecond)
	return b.memBackend.Take(ctx, command, key, l, n)
}

// TestPipelineKeyOrder sends pipelines that interleave two keys with
// other keys while the backend's takes finish out of order: each key's
// decisions are made in the order sent, as its falling remaining shows.
func TestPipelineKeyOrder(t *testing.T) {
	s := NewServer(&jitterBackend{memBackend: &memBackend{st: memstore.New()}}, Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	defer s.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := func(k string) string {
		return fmt.Sprintf("*5\r\n$11\r\nCL.THROTTLE\r\n$%d\r\n%s\r\n$3\r\n999\r\n$1\r\n1\r\n$5\r\n86400\r\n", len(k), k)
	}
	r := bufio.NewReader(c)
	last := map[string]int64{"a": 1000, "b": 1000}
	for round := range 20 {
		var in strings.Builder
		var keys []string
		for i := range 24 {
			k := []string{"a", "b", "x" + strconv.Itoa(round*24+i)}[i%3]
			keys = append(keys, k)
			in.WriteString(cmd(k))
		}
		if _, err := io.WriteString(c, in.String()); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			v, err := readReply(r)
			a, ok := v.([]int64)
			if err != nil || !ok || len(a) != 5 {
				t.Fatalf("round %d reply %d: %v, %v", round, i, v, err)
			}
			if _, ok := last[k]; !ok {
				continue
			}
			if a[2] != last[k]-1 {
				t.Fatalf("round %d reply %d, key %s: remaining %d after %d; want %d: decided out of order", round, i, k, a[2], last[k], last[k]-1)
			}
			last[k] = a[2]
		}
	}
}

// TestReadCommandAllocatesNothing reads pipelines of CL.THROTTLE into a
// kept argBuf: once it has grown, reading a command allocates nothing.
func TestReadCommandAllocatesNothing(t *testing.T) {
	cmd := "*5\r\n$11\r\nCL.THROTTLE\r\n$7\r\nk:12345\r\n$7\r\n1000000\r\n$7\r\n1000000\r\n$1\r\n1\r\n"
	in := strings.NewReader(strings.Repeat(cmd, 16))
	r := bufio.NewReaderSize(in, maxLine)
	lim := Limits{}
	lim.fill()
	var a argBuf
	read := func() {
		in.Seek(0, io.SeekStart)
		r.Reset(in)
		a.reset()
		for range 16 {
			args, _, err := readCommand(r, &lim, &a)
			if err != nil || len(args) != 5 || string(args[1]) != "k:12345" {
				t.Fatalf("%q, %v", args, err)
			}
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Errorf("%v allocations a pipeline of 16 commands; want 0", n)
	}
}

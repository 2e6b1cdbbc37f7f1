package h2client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// testLimit is the test servers' limit: 5 per hour per descriptor value.
var testLimit = weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}

func wantRLSRequest(domain, key string, descriptors int) *rls.RateLimitRequest {
	r := &rls.RateLimitRequest{Domain: domain, HitsAddend: 1}
	for i := range descriptors {
		r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: DescriptorKey(i), Value: key}}})
	}
	return r
}

// TestRequestEncoding: the hand-encoded request body is the gRPC
// framing of exactly the RateLimitRequest grpc-go's client would send.
func TestRequestEncoding(t *testing.T) {
	keys := []string{"", "k1", "k99999", "abuser-7", "ключ-🔑-キー", strings.Repeat("x", 127), strings.Repeat("y", 128),
		strings.Repeat("é", 300), strings.Repeat("z", 20000), strings.Repeat("w", 1<<21)}
	for _, domain := range []string{"bench", "", "домен", strings.Repeat("d", 200)} {
		for _, key := range keys {
			for _, descs := range []int{1, 5} {
				b := appendRLSRequest([]byte("junk"), domain, key, descs)[4:]
				if b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
					t.Fatalf("domain %q key %.20q: bad gRPC prefix % x for %d bytes", domain, key, b[:5], len(b)-5)
				}
				got := &rls.RateLimitRequest{}
				if err := proto.Unmarshal(b[5:], got); err != nil {
					t.Fatalf("domain %q key %.20q: %v", domain, key, err)
				}
				if want := wantRLSRequest(domain, key, descs); !proto.Equal(got, want) {
					t.Fatalf("domain %q key %.20q: got %v", domain, key, got)
				}
				if want, _ := proto.Marshal(wantRLSRequest(domain, key, descs)); len(want) != len(b)-5 {
					t.Fatalf("domain %q key %.20q: %d bytes, proto.Marshal makes %d", domain, key, len(b)-5, len(want))
				}
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { appendRLSRequest(make([]byte, 0, 256)[:0], "bench", "k12345", 5) }); n > 1 {
		t.Errorf("%v allocations per request body", n)
	}
}

// TestOverallCode: only the top-level overall_code decides, whatever
// else the response holds.
func TestOverallCode(t *testing.T) {
	for _, code := range []rls.RateLimitResponse_Code{rls.RateLimitResponse_UNKNOWN, rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT} {
		other := rls.RateLimitResponse_OVER_LIMIT
		if code == other {
			other = rls.RateLimitResponse_OK
		}
		b, _ := proto.Marshal(&rls.RateLimitResponse{
			OverallCode: code,
			Statuses:    []*rls.RateLimitResponse_DescriptorStatus{{Code: other, LimitRemaining: 3}},
			RawBody:     bytes.Repeat([]byte{8, 2}, 100),
		})
		got, err := rlsOverallCode(b)
		if err != nil || got != int32(code) {
			t.Errorf("%v: got %v, %v", code, got, err)
		}
	}
	if _, err := rlsOverallCode([]byte{0x08}); err == nil {
		t.Error("truncated varint accepted")
	}
}

// rlsServer is a real grpc-go RateLimitService backed by a weir limiter
// (5 per hour per key). It checks every request is exactly what the
// client was asked to send and can pad its answers, delay them, count
// the streams in flight per connection, or fail them.
type rlsServer struct {
	rls.UnimplementedRateLimitServiceServer
	lim        *weir.Limiter
	domain     string
	keyPrefix  string        // every key starts with this
	pad        int           // bytes of raw_body in each response
	delay      time.Duration // before answering
	fail       error         // answer every call with this
	calls      atomic.Int64
	mu         sync.Mutex
	bad        []string
	inFlight   map[string]int // per connection (peer address)
	maxPerConn int
}

func newRLSServer(domain string) *rlsServer {
	return &rlsServer{lim: weir.NewLimiter(memstore.New()), domain: domain, inFlight: map[string]int{}}
}

func (s *rlsServer) ShouldRateLimit(ctx context.Context, req *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	s.calls.Add(1)
	p, _ := peer.FromContext(ctx)
	s.mu.Lock()
	if req.Domain != s.domain || req.HitsAddend != 1 || len(req.Descriptors) != 1 || len(req.Descriptors[0].Entries) != 1 ||
		req.Descriptors[0].Entries[0].Key != "client" || !strings.HasPrefix(req.Descriptors[0].Entries[0].Value, s.keyPrefix) ||
		!proto.Equal(req, wantRLSRequest(s.domain, req.Descriptors[0].Entries[0].Value, 1)) {
		s.bad = append(s.bad, fmt.Sprintf("%.200v", req))
	}
	s.inFlight[p.Addr.String()]++
	s.maxPerConn = max(s.maxPerConn, s.inFlight[p.Addr.String()])
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[p.Addr.String()]--
		s.mu.Unlock()
	}()
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	if s.fail != nil {
		return nil, s.fail
	}
	r, err := s.lim.Allow(ctx, req.Descriptors[0].Entries[0].Value, testLimit)
	if err != nil {
		return nil, err
	}
	code, other := rls.RateLimitResponse_OK, rls.RateLimitResponse_OVER_LIMIT
	if !r.Allowed {
		code, other = other, code
	}
	return &rls.RateLimitResponse{
		OverallCode: code,
		// A descriptor status with the opposite code: only overall_code counts.
		Statuses: []*rls.RateLimitResponse_DescriptorStatus{{Code: other}},
		RawBody:  bytes.Repeat([]byte{'p'}, s.pad),
	}, nil
}

func (s *rlsServer) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bad) > 0 {
		t.Fatalf("server received %d requests unlike the ones asked for, e.g. %s", len(s.bad), s.bad[0])
	}
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func startRLS(t *testing.T, srv *rlsServer) (string, *grpc.Server, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	gs := grpc.NewServer()
	rls.RegisterRateLimitServiceServer(gs, srv)
	go gs.Serve(cl)
	t.Cleanup(gs.Stop)
	return ln.Addr().String(), gs, cl
}

// callersFor returns the calls of conns clients that concurrency callers
// will share as weir bench shares them: caller w uses client w % conns, so
// a client is shared when more than one caller uses it.
func callersFor(t *testing.T, addr, domain string, concurrency, conns int) []func(context.Context, string) (bool, error) {
	t.Helper()
	out := make([]func(context.Context, string) (bool, error), conns)
	for i := range out {
		users := concurrency / conns
		if i < concurrency%conns {
			users++
		}
		cl := New(addr, domain, users > 1)
		t.Cleanup(cl.Close)
		out[i] = cl.ShouldRateLimit
	}
	return out
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestExactCounts: one caller on one connection (the synchronous path)
// gets exactly the limiter's decisions, in order.
func TestExactCounts(t *testing.T) {
	srv := newRLSServer("bench")
	addr, _, ln := startRLS(t, srv)
	call := callersFor(t, addr, "bench", 1, 1)[0]
	ctx := testCtx(t)
	for _, key := range []string{"alice", "ключ-🔑"} {
		var got []bool
		for i := 0; i < 12; i++ {
			ok, err := call(ctx, key)
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			got = append(got, ok)
		}
		want := "[true true true true true false false false false false false false]"
		if fmt.Sprint(got) != want {
			t.Fatalf("%s: %v, want %s (5 allowed, then 7 limited)", key, got, want)
		}
	}
	srv.check(t)
	if srv.calls.Load() != 24 || ln.n.Load() != 1 {
		t.Fatalf("server saw %d calls on %d connections, want 24 on 1", srv.calls.Load(), ln.n.Load())
	}
}

// TestMultiplexed: 16 callers on 2 connections have their calls in
// flight at once on each connection, and every decision is counted.
func TestMultiplexed(t *testing.T) {
	srv := newRLSServer("other-domain")
	srv.delay = 2 * time.Millisecond
	addr, _, ln := startRLS(t, srv)
	const callers, conns, keys, perKey = 16, 2, 10, 16
	cs := callersFor(t, addr, "other-domain", callers, conns)
	ctx := testCtx(t)
	var allowed, limited atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, callers)
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call := cs[w%conns]
			for i := 0; i < keys*perKey/callers; i++ {
				ok, err := call(ctx, fmt.Sprintf("key-%d", (w+i)%keys))
				if err != nil {
					errc <- err
					return
				}
				if ok {
					allowed.Add(1)
				} else {
					limited.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	srv.check(t)
	if allowed.Load() != keys*5 || limited.Load() != keys*(perKey-5) {
		t.Fatalf("%d allowed, %d limited; want %d and %d", allowed.Load(), limited.Load(), keys*5, keys*(perKey-5))
	}
	if ln.n.Load() != conns {
		t.Fatalf("%d connections, want %d", ln.n.Load(), conns)
	}
	if srv.maxPerConn < 4 {
		t.Fatalf("at most %d calls in flight on a connection shared by 8 callers", srv.maxPerConn)
	}
}

// TestGRPCError: a gRPC error status, with a message that needs
// percent-encoding, fails the call with that status.
func TestGRPCError(t *testing.T) {
	srv := newRLSServer("bench")
	srv.fail = status.Error(codes.Unavailable, "store down: ünïcode 100% \x01 gone")
	addr, _, _ := startRLS(t, srv)
	ctx := testCtx(t)
	for _, n := range []int{1, 3} {
		call := callersFor(t, addr, "bench", n, 1)[0]
		for i := 0; i < 3; i++ {
			_, err := call(ctx, "alice")
			if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "store down: ünïcode 100% \x01 gone" ||
				!strings.Contains(err.Error(), "Unavailable") {
				t.Fatalf("%d callers: err = %v, want Unavailable with the message", n, err)
			}
		}
	}
}

// TestFlowControl: far more data than the default 64 KiB windows in
// both directions, on one connection: 5000 calls with 2 KB keys, answers
// padded to 1 KB while the client advertises only the default connection
// window (so it must top it up), and keys larger than a frame and than a
// stream's window (so it must split and wait for WINDOW_UPDATEs).
func TestFlowControl(t *testing.T) {
	defer func(s, c int64) { recvStreamWindow, recvConnWindow = s, c }(recvStreamWindow, recvConnWindow)
	recvConnWindow = h2DefaultWindow
	srv := newRLSServer("bench")
	srv.pad = 1000
	prefix := strings.Repeat("k", 2000)
	srv.keyPrefix = prefix
	addr, _, ln := startRLS(t, srv)
	ctx := testCtx(t)

	cl := New(addr, "bench", false)
	defer cl.Close()
	allowed := 0
	for i := 0; i < 5000; i++ {
		ok, err := cl.ShouldRateLimit(ctx, fmt.Sprintf("%s-%d", prefix, i%1000))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if ok {
			allowed++
		}
	}
	if allowed != 5000 {
		t.Fatalf("%d of 5000 allowed (1000 keys × 5)", allowed)
	}
	for i := 0; i < 7; i++ {
		ok, err := cl.ShouldRateLimit(ctx, prefix+strings.Repeat("🔑", 50_000)) // 200 KB
		if err != nil || ok != (i < 5) {
			t.Fatalf("big key, call %d: %v, %v", i, ok, err)
		}
	}
	if cl.cur.windowWaits == 0 {
		t.Fatal("200 KB requests never waited for the server's window")
	}
	srv.check(t)

	// Many callers on one connection compete for its send window.
	shared := New(addr, "bench", true)
	defer shared.Close()
	var wg sync.WaitGroup
	var got atomic.Int64
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				ok, err := shared.ShouldRateLimit(ctx, fmt.Sprintf("%s-big-%d-%s", prefix, w, strings.Repeat("x", 100_000)))
				if err != nil {
					errc <- err
					return
				}
				if ok {
					got.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if got.Load() != 40 || shared.cur.windowWaits == 0 {
		t.Fatalf("%d of 40 allowed; %d waits for window", got.Load(), shared.cur.windowWaits)
	}
	srv.check(t)
	if ln.n.Load() != 2 {
		t.Fatalf("%d connections, want 2", ln.n.Load())
	}
}

// TestStreamIDsRunOut: a connection whose stream IDs run out is
// replaced by a new one before the next call.
func TestStreamIDsRunOut(t *testing.T) {
	srv := newRLSServer("bench")
	addr, _, ln := startRLS(t, srv)
	ctx := testCtx(t)
	cl := New(addr, "bench", false)
	defer cl.Close()
	if _, err := cl.ShouldRateLimit(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	first := cl.cur
	first.mu.Lock()
	first.nextID = maxStreamID - 2
	first.mu.Unlock()
	for i := 0; i < 4; i++ {
		if _, err := cl.ShouldRateLimit(ctx, "a"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if i == 1 && cl.cur != first {
			t.Fatal("replaced the connection before its last stream ID")
		}
	}
	if cl.cur == first || !first.dead() || ln.n.Load() != 2 {
		t.Fatalf("after the last stream ID: same conn %v, old one closed %v, %d connections", cl.cur == first, first.dead(), ln.n.Load())
	}
}

// TestServerStops: when the server stops, gracefully (GOAWAY, then
// draining) or not, every caller, synchronous or multiplexed, gets errors
// rather than hanging.
func TestServerStops(t *testing.T) {
	for _, graceful := range []bool{true, false} {
		t.Run(fmt.Sprint("graceful=", graceful), func(t *testing.T) {
			srv := newRLSServer("bench")
			srv.delay = 200 * time.Microsecond
			addr, gs, _ := startRLS(t, srv)
			ctx := testCtx(t)
			sync1 := New(addr, "bench", false)
			sync2 := New(addr, "bench", false)
			shared := New(addr, "bench", true)
			defer sync1.Close()
			defer sync2.Close()
			defer shared.Close()
			var ok atomic.Int64
			var wg sync.WaitGroup
			errs := make([]error, 6)
			for w, cl := range []*Client{sync1, sync2, shared, shared, shared, shared} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						if _, err := cl.ShouldRateLimit(ctx, fmt.Sprint("k", ok.Add(1)%50)); err != nil {
							errs[w] = err
							return
						}
					}
				}()
			}
			for ok.Load() < 300 {
				time.Sleep(time.Millisecond)
			}
			stopped := make(chan struct{})
			go func() {
				if graceful {
					gs.GracefulStop()
				} else {
					gs.Stop()
				}
				close(stopped)
			}()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("callers still running 10s after the server stopped")
			}
			for w, err := range errs {
				if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("caller %d: %v", w, err)
				}
				t.Logf("caller %d: %v", w, err)
			}
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Fatal("server still draining after 10s")
			}
		})
	}
}

// fakeH2 is a scripted HTTP/2 server for what grpc-go never does: it
// checks the client's framing, headers, stream IDs, flow control and
// concurrency against what it advertised, and answers each request
// through respond.
type fakeH2 struct {
	t        *testing.T
	ln       net.Listener
	settings []http2.Setting
	respond  func(fc *fakeConn, id uint32, key string)
	// grant says how much window to give back per DATA frame received
	// (default: all of it, at once).
	grant func(n uint32) []uint32
	// onData, if set, runs (in a goroutine) after the connection's nth DATA frame.
	onData func(fc *fakeConn, nth int)

	mu       sync.Mutex
	bad      []string
	rsts     []http2.ErrCode
	requests int
	accepts  int
}

func newFakeH2(t *testing.T, respond func(fc *fakeConn, id uint32, key string), settings ...http2.Setting) *fakeH2 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeH2{t: t, ln: ln, settings: settings, respond: respond}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.accepts++
			h.mu.Unlock()
			go h.serve(nc)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return h
}

func (h *fakeH2) errorf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bad = append(h.bad, fmt.Sprintf(format, args...))
}

// counts returns the connections accepted and the requests received.
func (h *fakeH2) counts() (accepts, requests int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.accepts, h.requests
}

func (h *fakeH2) check() {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.bad) > 0 {
		h.t.Fatalf("protocol violations seen by the server:\n%s", strings.Join(h.bad, "\n"))
	}
}

// fakeConn is one connection of fakeH2.
type fakeConn struct {
	h  *fakeH2
	nc net.Conn
	fr *http2.Framer

	wmu    sync.Mutex // writes and enc
	enc    *hpack.Encoder
	encBuf bytes.Buffer

	pings map[[8]byte]chan struct{} // PINGs sent, closed on their ACK (under mu)

	// Read side (the serve goroutine), and mu for what respond touches.
	mu         sync.Mutex
	open       map[uint32]bool
	maxStreams uint32            // SETTINGS_MAX_CONCURRENT_STREAMS, once ACKed
	initWin    int64             // SETTINGS_INITIAL_WINDOW_SIZE, once ACKed
	pending    [][]http2.Setting // sent, not yet ACKed
	connWin    int64
	streamWin  map[uint32]int64
	bodies     map[uint32][]byte
	dataFrames int
	lastID     uint32
	expectSize bool // the next header block must start with a size update
	fields     map[string]string
	block      []byte
	blockID    uint32
	dec        *hpack.Decoder
}

func (h *fakeH2) serve(nc net.Conn) {
	defer nc.Close()
	fc := &fakeConn{h: h, nc: nc, fr: http2.NewFramer(nc, nc), pings: map[[8]byte]chan struct{}{},
		open: map[uint32]bool{}, maxStreams: 1 << 31, initWin: h2DefaultWindow, connWin: h2DefaultWindow,
		streamWin: map[uint32]int64{}, bodies: map[uint32][]byte{}}
	fc.enc = hpack.NewEncoder(&fc.encBuf)
	fc.dec = hpack.NewDecoder(h2DefaultTableSize, func(f hpack.HeaderField) { fc.fields[f.Name] = f.Value })
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil || string(preface) != http2.ClientPreface {
		h.errorf("bad preface %q: %v", preface, err)
		return
	}
	fc.sendSettings(h.settings...)
	for {
		f, err := fc.fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				h.errorf("read: %v", err)
			}
			return
		}
		if err := fc.handle(f); err != nil {
			h.errorf("%v", err)
			return
		}
	}
}

func (fc *fakeConn) sendSettings(s ...http2.Setting) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.pending = append(fc.pending, s)
	fc.fr.WriteSettings(s...)
}

func (fc *fakeConn) handle(f http2.Frame) error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			fc.wmu.Lock()
			fc.fr.WriteSettingsAck()
			fc.wmu.Unlock()
			return nil
		}
		// The client applied these settings before this ACK, and to
		// everything it sends after it.
		if len(fc.pending) == 0 {
			return errors.New("SETTINGS ACK for nothing")
		}
		for _, x := range fc.pending[0] {
			switch x.ID {
			case http2.SettingMaxConcurrentStreams:
				fc.maxStreams = x.Val
			case http2.SettingInitialWindowSize:
				for id := range fc.open {
					fc.streamWin[id] += int64(x.Val) - fc.initWin
				}
				fc.initWin = int64(x.Val)
			case http2.SettingHeaderTableSize:
				fc.expectSize = true
				fc.dec.SetAllowedMaxDynamicTableSize(x.Val)
			}
		}
		fc.pending = fc.pending[1:]
	case *http2.PingFrame:
		if f.IsAck() {
			ch, ok := fc.pings[f.Data]
			if !ok {
				return fmt.Errorf("PING ACK %x for no PING", f.Data)
			}
			close(ch)
			delete(fc.pings, f.Data)
		}
	case *http2.HeadersFrame:
		if f.StreamID%2 != 1 || f.StreamID <= fc.lastID {
			return fmt.Errorf("stream %d after %d", f.StreamID, fc.lastID)
		}
		fc.lastID = f.StreamID
		if f.StreamEnded() {
			return fmt.Errorf("stream %d: request without a body", f.StreamID)
		}
		if uint32(len(fc.open)) >= fc.maxStreams {
			return fmt.Errorf("stream %d: %d streams open, limit %d", f.StreamID, len(fc.open), fc.maxStreams)
		}
		fc.open[f.StreamID] = true
		fc.streamWin[f.StreamID] = fc.initWin
		fc.blockID, fc.block = f.StreamID, append([]byte(nil), f.HeaderBlockFragment()...)
		if f.HeadersEnded() {
			return fc.endHeaders()
		}
	case *http2.ContinuationFrame:
		fc.block = append(fc.block, f.HeaderBlockFragment()...)
		if f.HeadersEnded() {
			return fc.endHeaders()
		}
	case *http2.DataFrame:
		id, n := f.StreamID, int64(f.Length)
		if !fc.open[id] {
			return fmt.Errorf("DATA on stream %d, not open", id)
		}
		if n > fc.connWin || n > fc.streamWin[id] {
			return fmt.Errorf("stream %d: %d bytes of DATA with windows of %d (connection) and %d (stream)", id, n, fc.connWin, fc.streamWin[id])
		}
		fc.connWin -= n
		fc.streamWin[id] -= n
		fc.bodies[id] = append(fc.bodies[id], f.Data()...)
		if fc.dataFrames++; fc.h.onData != nil {
			go fc.h.onData(fc, fc.dataFrames)
		}
		if f.StreamEnded() {
			fc.request(id)
		}
		if n > 0 {
			grants := []uint32{uint32(n)}
			if fc.h.grant != nil {
				grants = fc.h.grant(uint32(n))
			}
			fc.wmu.Lock()
			for _, g := range grants {
				fc.connWin += int64(g)
				fc.fr.WriteWindowUpdate(0, g)
				if !f.StreamEnded() {
					fc.streamWin[id] += int64(g)
					fc.fr.WriteWindowUpdate(id, g)
				}
			}
			fc.wmu.Unlock()
		}
	case *http2.RSTStreamFrame:
		delete(fc.open, f.StreamID)
		fc.h.mu.Lock()
		fc.h.rsts = append(fc.h.rsts, f.ErrCode)
		fc.h.mu.Unlock()
	case *http2.GoAwayFrame:
		return fmt.Errorf("client sent GOAWAY %v", f.ErrCode)
	}
	return nil
}

func (fc *fakeConn) endHeaders() error {
	if fc.expectSize {
		fc.expectSize = false
		if fc.block[0]&0xe0 != 0x20 {
			return fmt.Errorf("stream %d: no dynamic table size update after SETTINGS_HEADER_TABLE_SIZE 0", fc.blockID)
		}
	}
	fc.fields = map[string]string{}
	if _, err := fc.dec.Write(fc.block); err != nil {
		return fmt.Errorf("stream %d: hpack: %v", fc.blockID, err)
	}
	if err := fc.dec.Close(); err != nil {
		return fmt.Errorf("stream %d: hpack: %v", fc.blockID, err)
	}
	want := map[string]string{":method": "POST", ":scheme": "http", ":path": rlsPath, ":authority": fc.h.ln.Addr().String(),
		"content-type": "application/grpc", "te": "trailers"}
	if fmt.Sprint(fc.fields) != fmt.Sprint(want) {
		return fmt.Errorf("stream %d: headers %v, want %v", fc.blockID, fc.fields, want)
	}
	return nil
}

// request decodes a complete request and hands it to respond.
func (fc *fakeConn) request(id uint32) {
	b := fc.bodies[id]
	delete(fc.bodies, id)
	req := &rls.RateLimitRequest{}
	if len(b) < 5 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 || proto.Unmarshal(b[5:], req) != nil ||
		len(req.Descriptors) != 1 || len(req.Descriptors[0].Entries) != 1 {
		fc.h.errorf("stream %d: bad request body % x", id, b[:min(len(b), 40)])
		return
	}
	key := req.Descriptors[0].Entries[0].Value
	if !proto.Equal(req, wantRLSRequest("bench", key, 1)) {
		fc.h.errorf("stream %d: request %v", id, req)
	}
	fc.h.mu.Lock()
	fc.h.requests++
	fc.h.mu.Unlock()
	go fc.h.respond(fc, id, key)
}

// headers writes a header block (the caller holds wmu).
func (fc *fakeConn) headers(id uint32, end bool, kv ...string) {
	fc.encBuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		fc.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	fc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: fc.encBuf.Bytes(), EndHeaders: true, EndStream: end})
}

// closeStream marks id closed, as the client will once it reads what was just written.
func (fc *fakeConn) closeStream(id uint32) {
	fc.mu.Lock()
	delete(fc.open, id)
	fc.mu.Unlock()
}

// reply answers id with a whole response: headers, message, trailers.
func (fc *fakeConn) reply(id uint32, code rls.RateLimitResponse_Code) {
	m, _ := proto.Marshal(&rls.RateLimitResponse{OverallCode: code})
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m)))
	fc.closeStream(id)
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fc.headers(id, false, ":status", "200", "content-type", "application/grpc")
	fc.fr.WriteData(id, false, append(body, m...))
	fc.headers(id, true, "grpc-status", "0")
}

func (fc *fakeConn) write(fn func(fr *http2.Framer)) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fn(fc.fr)
}

// waitAcked waits until the client has ACKed every SETTINGS sent.
func (fc *fakeConn) waitAcked() error {
	for t0 := time.Now(); time.Since(t0) < 5*time.Second; time.Sleep(time.Millisecond) {
		fc.mu.Lock()
		n := len(fc.pending)
		fc.mu.Unlock()
		if n == 0 {
			return nil
		}
	}
	return errors.New("SETTINGS not ACKed in 5s")
}

// ping sends a PING and waits for its ACK.
func (fc *fakeConn) ping(data [8]byte) error {
	ch := make(chan struct{})
	fc.mu.Lock()
	fc.pings[data] = ch
	fc.mu.Unlock()
	fc.write(func(fr *http2.Framer) { fr.WritePing(false, data) })
	select {
	case <-ch:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("no ACK for PING %x in 5s", data)
	}
}

// TestProtocol runs the lean client, synchronous and multiplexed,
// against the scripted server.
func TestProtocol(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) { testProtocol(t, shared) })
	}
}

func testProtocol(t *testing.T, shared bool) {
	ctx := testCtx(t)
	// run makes n calls with 4 goroutines if shared, else one.
	run := func(cl *Client, n int, key func(i int) string) (allowed int, errs []error) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var next atomic.Int64
		workers := 1
		if shared {
			workers = 4
		}
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					ok, err := cl.ShouldRateLimit(ctx, key(i))
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else if ok {
						allowed++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return allowed, errs
	}
	byKey := func(fc *fakeConn, id uint32, key string) {
		code := rls.RateLimitResponse_OK
		if strings.HasPrefix(key, "no") {
			code = rls.RateLimitResponse_OVER_LIMIT
		}
		fc.reply(id, code)
	}

	t.Run("ping, windows, frame size, max streams, settings changes", func(t *testing.T) {
		var fcs sync.Map
		h := newFakeH2(t, func(fc *fakeConn, id uint32, key string) {
			if _, seen := fcs.LoadOrStore(fc, true); !seen {
				// Mid-connection: a larger stream window, then a smaller one.
				fc.sendSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 3000})
				fc.sendSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 700})
				if err := fc.waitAcked(); err != nil {
					fc.h.errorf("stream %d: %v", id, err)
				}
			}
			if id%3 == 0 {
				if err := fc.ping([8]byte{byte(id), 1, 2, 3, 4, 5, 6, 7}); err != nil {
					fc.h.errorf("stream %d: %v", id, err)
				}
			}
			byKey(fc, id, key)
		}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 100}, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 2},
			http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
		h.onData = func(fc *fakeConn, nth int) {
			// Change the stream window while streams wait for theirs.
			switch nth {
			case 10:
				fc.sendSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 40})
			case 300:
				fc.sendSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 5000})
			case 600:
				fc.sendSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 900})
			}
		}
		h.grant = func(n uint32) []uint32 { // trickle the windows back
			var g []uint32
			for ; n > 37; n -= 37 {
				g = append(g, 37)
			}
			return append(g, n)
		}
		cl := New(h.ln.Addr().String(), "bench", shared)
		defer cl.Close()
		// 40 × 20 KB > the 64 KiB connection window; each key > a frame.
		allowed, errs := run(cl, 40, func(i int) string {
			if i%4 == 0 {
				return "no-" + fmt.Sprint(i)
			}
			return fmt.Sprintf("%d-%s", i, strings.Repeat("ü", 10_000))
		})
		h.check()
		if accepts, requests := h.counts(); len(errs) > 0 || allowed != 30 || requests != 40 || accepts != 1 {
			t.Fatalf("%d allowed of 40 (want 30), %d requests on %d connections, errors %v", allowed, requests, accepts, errs)
		}
	})

	t.Run("trailers-only error", func(t *testing.T) {
		h := newFakeH2(t, func(fc *fakeConn, id uint32, key string) {
			fc.closeStream(id)
			fc.write(func(*http2.Framer) {
				fc.headers(id, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "8", "grpc-message", "slow%20down%21")
			})
		})
		cl := New(h.ln.Addr().String(), "bench", shared)
		defer cl.Close()
		_, errs := run(cl, 6, func(int) string { return "k" })
		h.check()
		if len(errs) != 6 {
			t.Fatalf("%d errors, want 6", len(errs))
		}
		for _, err := range errs {
			if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "slow down!" {
				t.Fatalf("err = %v, want ResourceExhausted: slow down!", err)
			}
		}
	})

	t.Run("RST_STREAM", func(t *testing.T) {
		h := newFakeH2(t, func(fc *fakeConn, id uint32, key string) {
			if key == "refuse" {
				fc.closeStream(id)
				fc.write(func(fr *http2.Framer) { fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
				return
			}
			byKey(fc, id, key)
		})
		cl := New(h.ln.Addr().String(), "bench", shared)
		defer cl.Close()
		allowed, errs := run(cl, 20, func(i int) string {
			if i%2 == 0 {
				return "refuse"
			}
			return "ok"
		})
		h.check()
		if accepts, _ := h.counts(); allowed != 10 || len(errs) != 10 || accepts != 1 {
			t.Fatalf("%d allowed, %d errors on %d connections; want 10, 10 on 1", allowed, len(errs), accepts)
		}
		for _, err := range errs {
			if !strings.Contains(err.Error(), "RST_STREAM (REFUSED_STREAM)") {
				t.Fatalf("err = %v, want it to name RST_STREAM (REFUSED_STREAM)", err)
			}
		}
	})

	t.Run("GOAWAY", func(t *testing.T) {
		var n atomic.Int32
		h := newFakeH2(t, func(fc *fakeConn, id uint32, key string) {
			if n.Add(1) == 3 {
				// Streams after this one's predecessor were not processed.
				fc.write(func(fr *http2.Framer) { fr.WriteGoAway(id-2, http2.ErrCodeEnhanceYourCalm, []byte("calm down")) })
				time.Sleep(50 * time.Millisecond)
				fc.nc.Close()
				return
			}
			byKey(fc, id, key)
		})
		cl := New(h.ln.Addr().String(), "bench", shared)
		defer cl.Close()
		for i := 0; i < 2; i++ {
			if ok, err := cl.ShouldRateLimit(ctx, "ok"); !ok || err != nil {
				t.Fatalf("call %d: %v %v", i, ok, err)
			}
		}
		_, err := cl.ShouldRateLimit(ctx, "ok")
		if err == nil || !strings.Contains(err.Error(), "GOAWAY (ENHANCE_YOUR_CALM, last stream 3") || !strings.Contains(err.Error(), "calm down") {
			t.Fatalf("err = %v, want the GOAWAY named", err)
		}
		// The next call goes to a new connection.
		if ok, err := cl.ShouldRateLimit(ctx, "ok"); !ok || err != nil {
			t.Fatalf("after GOAWAY: %v %v", ok, err)
		}
		if accepts, _ := h.counts(); accepts != 2 {
			t.Fatalf("after GOAWAY: %d connections, want 2", accepts)
		}
		h.check()
	})

	t.Run("cancel", func(t *testing.T) {
		h := newFakeH2(t, func(fc *fakeConn, id uint32, key string) {
			if key == "hang" {
				return // never answer
			}
			byKey(fc, id, key)
		})
		cl := New(h.ln.Addr().String(), "bench", shared)
		defer cl.Close()
		for i := 0; i < 2; i++ {
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			errc := make(chan error, 1)
			go func() { _, err := cl.ShouldRateLimit(cctx, "hang"); errc <- err }()
			select {
			case err := <-errc:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err = %v, want the deadline", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("call still running 2s after its 100ms deadline")
			}
			cancel()
			if ok, err := cl.ShouldRateLimit(ctx, "ok"); !ok || err != nil {
				t.Fatalf("after a cancelled call: %v %v", ok, err)
			}
		}
		h.check()
		h.mu.Lock()
		defer h.mu.Unlock()
		if shared && (len(h.rsts) != 2 || h.rsts[0] != http2.ErrCodeCancel || h.accepts != 1) {
			t.Fatalf("RST_STREAMs %v on %d connections; want 2 CANCELs on 1", h.rsts, h.accepts)
		}
		if !shared && h.accepts != 3 {
			t.Fatalf("%d connections; want 3 (a synchronous call is cut off by closing its connection)", h.accepts)
		}
	})
}

// BenchmarkCall: one synchronous call against grpc-go's server in the
// same process (so the CPU time is both sides'; use -memprofile or
// -cpuprofile with a focus on h2client. to see the client's;
// BenchmarkH2Client measures the client alone).
func BenchmarkCall(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	rls.RegisterRateLimitServiceServer(gs, &okServer{})
	go gs.Serve(ln)
	defer gs.Stop()
	cl := New(ln.Addr().String(), "bench", false)
	defer cl.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := cl.ShouldRateLimit(ctx, "k12345"); err != nil {
			b.Fatal(err)
		}
	}
}

// okServer allows everything, without a limiter.
type okServer struct {
	rls.UnimplementedRateLimitServiceServer
}

func (okServer) ShouldRateLimit(context.Context, *rls.RateLimitRequest) (*rls.RateLimitResponse, error) {
	return &rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OK}, nil
}

// BenchmarkRLSDecode compares decoding only overall_code with protowire
// (what the lean client does) against proto.Unmarshal of the whole response.
func BenchmarkRLSDecode(b *testing.B) {
	m, _ := proto.Marshal(&rls.RateLimitResponse{OverallCode: rls.RateLimitResponse_OVER_LIMIT})
	b.Run("protowire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if c, err := rlsOverallCode(m); err != nil || c != 2 {
				b.Fatal(c, err)
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r rls.RateLimitResponse
			if err := proto.Unmarshal(m, &r); err != nil || r.OverallCode != 2 {
				b.Fatal(err)
			}
		}
	})
}

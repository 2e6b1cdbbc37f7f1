// Package h2client is a lean gRPC client for one unary method, Envoy's
// RateLimitService/ShouldRateLimit, over cleartext HTTP/2 (h2c with prior
// knowledge, as grpc-go's insecure credentials). It is weir bench's default
// gRPC client, so that `weir bench --target grpc` measures weir rather than
// its own load generator. Per call it spends about a third of the CPU time
// of net/http's own HTTP/2 (Go 1.24+ h2c) and of grpc-go's client
// (BenchmarkH2Client; docs/benchmarks.md), which on a small machine would
// starve the server it shares the cores with.
//
// Like h2load, the client does as little as the protocol allows: the
// HPACK block of the request headers is encoded once per connection, the
// request body is hand-encoded protobuf written into a reused buffer, only
// field 1 of the response (overall_code) is decoded, with one caller per
// connection the caller itself writes its request and reads the frames of
// the answer, with no goroutine handoff, and the PING ACKs grpc-go's
// server asks for about once a call ride in the next request's write.
//
// Framing and HPACK are golang.org/x/net/http2's Framer and hpack. The
// client speaks correct HTTP/2: preface and SETTINGS (and ACKs the
// server's), PING ACKs, GOAWAY and RST_STREAM (the calls they end fail with
// an error naming them), odd increasing stream IDs with a fresh connection
// before they run out, flow control in both directions, and the server's
// SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS,
// SETTINGS_INITIAL_WINDOW_SIZE and SETTINGS_HEADER_TABLE_SIZE.
package h2client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// The receive windows the client advertises: per stream through
// SETTINGS_INITIAL_WINDOW_SIZE, per connection through a WINDOW_UPDATE
// right after the preface. Variables so that tests can shrink them.
var (
	recvStreamWindow int64 = 1 << 20
	recvConnWindow   int64 = 1 << 24
)

const (
	// rlsPath is the one method the client calls.
	rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// maxStreamID is the largest stream ID HTTP/2 allows; a
	// connection whose next ID would pass it is replaced.
	maxStreamID = 1<<31 - 1
	// maxResponse bounds a response message, as grpc-go's default
	// max receive size does.
	maxResponse = 4 << 20
	// http2 defaults (RFC 9113 §6.5.2) that hold until the server's
	// SETTINGS say otherwise.
	h2DefaultWindow    = 65535
	h2DefaultFrameSize = 16384
	h2DefaultTableSize = 4096
	h2MaxWindow        = 1<<31 - 1
)

var (
	// errUnusable: the connection takes no new streams (GOAWAY, a
	// failure, or stream IDs used up) and the request was not sent, so it
	// can go to a new connection.
	errUnusable  = errors.New("connection takes no new streams")
	errClosed    = errors.New("h2client: client closed")
	errRetired   = errors.New("connection retired")
	aLongTimeAgo = time.Unix(1, 0)
)

// Client makes ShouldRateLimit calls to one address over one HTTP/2
// connection at a time: it dials the connection on first use and replaces
// it when it stops taking new streams. A Client made for one caller at a
// time (shared false) runs each call synchronously on the caller's
// goroutine; a shared one multiplexes its callers' streams, with a reader
// goroutine per connection.
type Client struct {
	addr, domain string
	shared       bool // several callers: multiplex them on one connection
	descriptors  int  // descriptors per call (SetDescriptors), at least 1

	callMu sync.Mutex // synchronous mode: one call at a time

	mu     sync.Mutex // guards the fields below
	cur    *clientConn
	all    map[*clientConn]struct{} // every connection not yet closed
	closed bool
}

// New returns a client for the gRPC server at addr (host:port) that asks
// about descriptors in domain; shared says whether several goroutines will
// call it at once. It dials nothing until the first call.
func New(addr, domain string, shared bool) *Client {
	return &Client{addr: addr, domain: domain, shared: shared, descriptors: 1, all: map[*clientConn]struct{}{}}
}

// SetDescriptors makes each call carry n descriptors (at least 1), the
// i-th of them [{DescriptorKey(i): key}]. Call it before the first call.
func (cl *Client) SetDescriptors(n int) { cl.descriptors = max(n, 1) }

// DescriptorKey is the entry key of a call's i-th descriptor (from 0):
// "client", then "client2", "client3", ...
func DescriptorKey(i int) string {
	if i < len(descriptorKeys) {
		return descriptorKeys[i]
	}
	return "client" + strconv.Itoa(i+1)
}

// descriptorKeys are the first DescriptorKeys, made once.
var descriptorKeys = func() []string {
	ks := []string{"client"}
	for i := 2; i <= 64; i++ {
		ks = append(ks, "client"+strconv.Itoa(i))
	}
	return ks
}()

// ShouldRateLimit makes one call, for the descriptor [{client: key}] with
// hits_addend 1, and reports whether it was allowed (an overall_code other
// than OVER_LIMIT). A gRPC error status comes back as a
// google.golang.org/grpc/status error.
func (cl *Client) ShouldRateLimit(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if !cl.shared {
		cl.callMu.Lock()
		defer cl.callMu.Unlock()
	}
	for attempt := 0; ; attempt++ {
		var cc *clientConn
		if !cl.shared {
			cc = cl.cur // only this call changes it (close does not)
		}
		if cc == nil {
			var err error
			if cc, err = cl.conn(ctx); err != nil {
				return false, err
			}
		}
		allowed, err := cc.roundTrip(ctx, cl.domain, key, cl.descriptors)
		if err == errUnusable && attempt < 3 {
			cl.drop(cc) // never sent: try a fresh connection
			continue
		}
		return allowed, err
	}
}

// conn returns a connection that takes new streams, dialling one if need be.
func (cl *Client) conn(ctx context.Context) (*clientConn, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil, errClosed
	}
	if cc := cl.cur; cc != nil {
		if cc.usable() {
			return cc, nil
		}
		cc.retire()
		cl.cur = nil
	}
	for x := range cl.all {
		if x.dead() {
			delete(cl.all, x)
		}
	}
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", cl.addr)
	if err != nil {
		return nil, err
	}
	cc := newClientConn(nc, cl.addr, cl.shared)
	if err := cc.start(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2 connection to %s: %w", cl.addr, err)
	}
	if cl.shared {
		go cc.readLoop()
	} else {
		heldAcks.add(cc)
	}
	cl.cur = cc
	cl.all[cc] = struct{}{}
	return cc, nil
}

// drop replaces cc, which takes no new streams, if it is still the current
// connection.
func (cl *Client) drop(cc *clientConn) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.cur == cc {
		cc.retire()
		cl.cur = nil
	}
}

// Close closes every connection; calls in flight fail, and later calls
// fail at once.
func (cl *Client) Close() {
	cl.mu.Lock()
	cl.closed = true
	all := cl.all
	cl.all = nil
	cl.mu.Unlock()
	for cc := range all {
		cc.close()
	}
}

// clientConn is one HTTP/2 connection of a Client.
//
// With one caller (synchronous mode) that caller writes its request and
// then reads frames itself until its stream ends; nothing else runs but
// heldAcks, now and then, to send a held-back PING ACK. With
// several callers (shared mode) they write their requests under mu and a
// reader goroutine reads every frame and hands each stream's outcome to
// its caller through the stream's done channel; callers waiting for flow
// control window or a free stream slot wait on the changed channel.
type clientConn struct {
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	fr     *http2.Framer
	shared bool
	addr   string

	readerDone chan struct{} // shared mode: closed when readLoop returns

	// The receive windows this connection advertised.
	streamWindow, connWindow int64

	mu sync.Mutex // guards everything below, and all writes to fr/bw

	err       error // once set, the connection is closed
	goAway    error // the server's GOAWAY; no new streams
	retired   bool  // replaced: close when the last stream ends
	nextID    uint32
	active    uint32                   // open streams
	streams   map[uint32]*clientStream // shared mode
	single    *clientStream            // synchronous mode: the open stream
	syncSt    clientStream             // synchronous mode: reused for every call
	scratch   []byte                   // synchronous mode: request body buffer
	changed   chan struct{}            // shared mode: closed on a state change someone waits for
	watched   context.Context          // synchronous mode: ctx whose end sets a past deadline on nc
	stopWatch func() bool

	// Synchronous mode: a PING ACK waits in bw to go out with the next
	// request, or with heldAcks if no request comes soon.
	flushPending bool
	ackHeld      atomic.Bool // flushPending, for heldAcks to read without mu

	// What the server allows us.
	connSendWin int64
	peerInitWin int64 // SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame    int   // SETTINGS_MAX_FRAME_SIZE
	maxStreams  uint32

	// Request headers: HPACK-encoded by enc; once the encoder's dynamic
	// table holds them all, every later block is the same bytes, hdrCache.
	reqHeaders   []hpack.HeaderField
	reqHdrSize   uint32
	enc          *hpack.Encoder
	encBuf       bytes.Buffer
	encodes      int
	hdrCacheable bool
	hdrCache     []byte

	// Receive side, touched by whoever reads frames (under mu).
	recvAvail    int64 // connection receive window left
	dec          *hpack.Decoder
	hdrID        uint32 // stream of the header block being decoded
	hdrEndStream bool
	hf           respHeaders

	// Counters, for tests.
	windowWaits int
}

// respHeaders holds the fields the client cares about from one header block.
type respHeaders struct {
	status, contentType, grpcStatus, grpcMessage string
	hasGRPCStatus                                bool
}

// clientStream is one call.
type clientStream struct {
	id           uint32
	sendWin      int64
	recvd        int64
	gotHeaders   bool   // the response HEADERS arrived
	remoteClosed bool   // the server ended the stream
	reset        bool   // RST_STREAM sent or received
	msg          []byte // the gRPC-framed response
	done         chan struct{}
	finished     bool
	allowed      bool
	err          error
}

// newClientConn wraps nc; start sends the preface.
func newClientConn(nc net.Conn, addr string, shared bool) *clientConn {
	c := &clientConn{
		nc:           nc,
		addr:         addr,
		shared:       shared,
		br:           bufio.NewReaderSize(nc, 32<<10),
		bw:           bufio.NewWriterSize(nc, 32<<10),
		streamWindow: min(max(recvStreamWindow, 1), h2MaxWindow),
		connWindow:   min(max(recvConnWindow, h2DefaultWindow), h2MaxWindow),
		nextID:       1,
		connSendWin:  h2DefaultWindow,
		peerInitWin:  h2DefaultWindow,
		maxFrame:     h2DefaultFrameSize,
		maxStreams:   math.MaxUint32,
	}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetMaxReadFrameSize(h2DefaultFrameSize) // we do not raise SETTINGS_MAX_FRAME_SIZE
	c.fr.SetReuseFrames()
	c.dec = hpack.NewDecoder(h2DefaultTableSize, c.onField)
	c.dec.SetMaxStringLength(64 << 10)
	c.enc = hpack.NewEncoder(&c.encBuf)
	c.reqHeaders = []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: rlsPath},
		{Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
	}
	for _, f := range c.reqHeaders {
		c.reqHdrSize += f.Size()
	}
	c.hdrCacheable = c.reqHdrSize <= c.enc.MaxDynamicTableSize()
	c.recvAvail = c.connWindow
	if shared {
		c.streams = map[uint32]*clientStream{}
		c.readerDone = make(chan struct{})
	}
	return c
}

// start writes the client preface, our SETTINGS and the connection window.
func (c *clientConn) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(c.streamWindow)},
	)
	if c.connWindow > h2DefaultWindow {
		c.fr.WriteWindowUpdate(0, uint32(c.connWindow-h2DefaultWindow))
	}
	return c.bw.Flush()
}

// usable reports whether the connection takes new streams.
func (c *clientConn) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && c.goAway == nil && !c.retired && c.nextID <= maxStreamID
}

// dead reports whether the connection is closed.
func (c *clientConn) dead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// watch makes the end of ctx end a synchronous call promptly: it sets a
// deadline in the past on the connection, which fails the blocked read or
// write. Watching costs nothing per call while ctx stays the same. It
// reports false if an earlier ctx has ended, when the connection (its
// deadline spent) must be replaced. Called with mu held.
func (c *clientConn) watch(ctx context.Context) bool {
	if ctx == c.watched {
		return true
	}
	if c.stopWatch != nil && !c.stopWatch() {
		return false
	}
	c.watched, c.stopWatch = ctx, nil
	if ctx.Done() != nil {
		nc := c.nc
		c.stopWatch = context.AfterFunc(ctx, func() { nc.SetDeadline(aLongTimeAgo) })
	}
	return true
}

// retire stops new streams; the connection closes once its last stream ends.
func (c *clientConn) retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	if c.active == 0 {
		c.fail(errRetired)
	}
}

// close closes the connection, failing its calls, and waits for its reader.
func (c *clientConn) close() {
	c.mu.Lock()
	c.fail(errClosed)
	c.mu.Unlock()
	if c.shared {
		<-c.readerDone
	}
}

// readLoop is the shared mode's reader.
func (c *clientConn) readLoop() {
	defer close(c.readerDone)
	for !c.readOne(nil) {
	}
}

// roundTrip makes one call on the connection. It returns errUnusable,
// having sent nothing, if the connection takes no new streams.
func (c *clientConn) roundTrip(ctx context.Context, domain, key string, descriptors int) (bool, error) {
	c.mu.Lock()
	if !c.shared && !c.watch(ctx) {
		c.mu.Unlock()
		return false, errUnusable
	}
	st, err := c.open(ctx)
	if err != nil {
		c.mu.Unlock()
		return false, err
	}
	var body []byte
	if c.shared {
		body = appendRLSRequest(nil, domain, key, descriptors)
	} else {
		c.scratch = appendRLSRequest(c.scratch[:0], domain, key, descriptors)
		body = c.scratch
	}
	c.send(ctx, st, body)
	done := st.finished
	c.mu.Unlock()

	if c.shared {
		select {
		case <-st.done:
		case <-ctx.Done():
			c.mu.Lock()
			c.finishLocal(st, http2.ErrCodeCancel, ctx.Err())
			c.mu.Unlock()
		}
	} else {
		for !done {
			done = c.readOne(st)
		}
	}
	// st is finished and, in shared mode, out of the reader's reach.
	if st.err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err() // the call was cut off
		}
		return false, st.err
	}
	return st.allowed, nil
}

// open starts a stream, waiting for a free slot under the server's
// SETTINGS_MAX_CONCURRENT_STREAMS. Called with mu held; the caller must
// write the stream's HEADERS before releasing it, so that stream IDs and
// HPACK state reach the wire in order.
func (c *clientConn) open(ctx context.Context) (*clientStream, error) {
	for {
		if c.err != nil || c.goAway != nil || c.retired || c.nextID > maxStreamID {
			return nil, errUnusable
		}
		if c.active < c.maxStreams {
			break
		}
		if err := c.wait(ctx); err != nil && ctx.Err() != nil {
			return nil, err
		}
	}
	var st *clientStream
	if c.shared {
		st = &clientStream{done: make(chan struct{})}
		c.streams[c.nextID] = st
	} else {
		st = &c.syncSt
		*st = clientStream{msg: st.msg[:0]}
		c.single = st
	}
	st.id = c.nextID
	st.sendWin = c.peerInitWin
	c.nextID += 2
	c.active++
	return st, nil
}

// send writes the request: HEADERS (+CONTINUATION if the block is larger
// than the server's frame size) and the body in DATA frames within the
// flow control windows, the last with END_STREAM. Called with mu held.
// Failures finish the stream.
func (c *clientConn) send(ctx context.Context, st *clientStream, body []byte) {
	block := c.headerBlock()
	for first := true; first || len(block) > 0; first = false {
		n := min(len(block), c.maxFrame)
		frag := block[:n]
		block = block[n:]
		var err error
		if first {
			err = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: frag, EndHeaders: len(block) == 0})
		} else {
			err = c.fr.WriteContinuation(st.id, len(block) == 0, frag)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
	for len(body) > 0 {
		if st.finished {
			// Answered, reset or refused before we sent it all: stop
			// sending, and close our half if the server did not.
			if !st.reset && c.err == nil {
				st.reset = true
				if err := c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel); err != nil {
					c.fail(err)
				} else if err := c.bw.Flush(); err != nil {
					c.fail(err)
				}
			}
			return
		}
		n := int64(min(len(body), c.maxFrame))
		n = min(n, c.connSendWin, st.sendWin)
		if n <= 0 {
			c.windowWaits++
			if err := c.wait(ctx); err != nil {
				if ctx.Err() != nil {
					c.finishLocal(st, http2.ErrCodeCancel, err)
				}
				return // else the connection failed, which finished st
			}
			continue
		}
		if err := c.fr.WriteData(st.id, n == int64(len(body)), body[:n]); err != nil {
			c.fail(err)
			return
		}
		c.connSendWin -= n
		st.sendWin -= n
		body = body[n:]
	}
	c.flush()
}

// headerBlock returns the HPACK block of the request headers. Called with mu held.
func (c *clientConn) headerBlock() []byte {
	if c.hdrCache != nil {
		return c.hdrCache
	}
	c.encBuf.Reset()
	for _, f := range c.reqHeaders {
		c.enc.WriteField(f)
	}
	c.encodes++
	// The first block since the table (re)started adds the headers to
	// the server's dynamic table; if they all fit, the second and every
	// later block only refers to them.
	if c.hdrCacheable && c.encodes >= 2 {
		c.hdrCache = bytes.Clone(c.encBuf.Bytes())
	}
	return c.encBuf.Bytes()
}

// wait blocks until the connection's state changes: in synchronous mode
// by reading and handling one frame, in shared mode until the reader
// signals or ctx ends. It flushes what is buffered first, since the server
// may need it to grant what we wait for. Called with mu held, which it
// releases meanwhile. It returns ctx's error or the connection's.
func (c *clientConn) wait(ctx context.Context) error {
	if c.flush(); c.err != nil {
		return c.err
	}
	if !c.shared {
		c.mu.Unlock()
		c.readOne(nil)
		c.mu.Lock()
		if err := ctx.Err(); err != nil {
			return err
		}
		return c.err
	}
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	ch := c.changed
	c.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	if err == nil {
		err = c.err
	}
	return err
}

// deferFlush leaves what bw holds (a PING ACK) to go out with the next
// request, in the same write, rather than in a write of its own: grpc-go's
// server pings to estimate the bandwidth-delay product about once per
// round trip, which with one call per round trip would double the writes.
// heldAcks flushes it if no request follows within a few milliseconds.
// Called with mu held, in synchronous mode.
func (c *clientConn) deferFlush() {
	c.flushPending = true
	c.ackHeld.Store(true)
}

// flush writes out what bw holds. Called with mu held.
func (c *clientConn) flush() {
	if c.flushPending {
		c.flushPending = false
		c.ackHeld.Store(false)
	}
	if err := c.bw.Flush(); err != nil {
		c.fail(err)
	}
}

// heldAcks sends the PING ACKs that synchronous connections hold back for
// their next request when none has come within ackDelay. One goroutine
// for all of them, running while any is open: a timer per connection,
// reset on every PING, costs more than the write it saves.
var heldAcks ackFlusher

const ackDelay = 2 * time.Millisecond

// ackFlusher is the type of heldAcks.
type ackFlusher struct {
	mu      sync.Mutex
	conns   map[*clientConn]struct{} // open synchronous connections
	running bool
}

// add registers a synchronous connection; fail unregisters it.
func (f *ackFlusher) add(c *clientConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		f.conns = map[*clientConn]struct{}{}
	}
	f.conns[c] = struct{}{}
	if !f.running {
		f.running = true
		go f.run()
	}
}

func (f *ackFlusher) remove(c *clientConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

func (f *ackFlusher) run() {
	var held []*clientConn
	for {
		time.Sleep(ackDelay)
		f.mu.Lock()
		if len(f.conns) == 0 {
			f.running = false
			f.mu.Unlock()
			return
		}
		held = held[:0]
		for c := range f.conns {
			if c.ackHeld.Load() {
				held = append(held, c)
			}
		}
		f.mu.Unlock()
		for _, c := range held {
			// If c is busy, it is sending a request (and the ACK) or
			// will be seen again next time.
			if c.mu.TryLock() {
				if c.flushPending && c.err == nil {
					c.flush()
				}
				c.mu.Unlock()
			}
		}
	}
}

// broadcast wakes the callers in wait. Called with mu held.
func (c *clientConn) broadcast() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// readOne reads and handles a frame, and any more that are already
// buffered, until st (if not nil) finishes. It reports whether st has
// finished or the connection has failed.
func (c *clientConn) readOne(st *clientStream) bool {
	f, err := c.fr.ReadFrame()
	c.mu.Lock()
	for {
		if err == nil {
			err = c.handle(f)
		}
		if err != nil {
			c.readError(err)
		}
		if c.err != nil || st != nil && st.finished || !c.frameBuffered() {
			break
		}
		f, err = c.fr.ReadFrame() // does not block: the frame is buffered
	}
	done := c.err != nil || st != nil && st.finished
	c.mu.Unlock()
	return done
}

// frameBuffered reports whether a whole frame waits in br, so that reading
// it does not block.
func (c *clientConn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := c.br.Peek(3)
	return n-9 >= int(h[0])<<16|int(h[1])<<8|int(h[2])
}

// readError handles an error from reading or handling a frame: the end of
// one stream for a StreamError, else of the connection. Called with mu held.
func (c *clientConn) readError(err error) {
	var se http2.StreamError
	if errors.As(err, &se) {
		// A malformed frame on one stream (e.g. a zero WINDOW_UPDATE).
		if s := c.lookup(se.StreamID); s != nil {
			c.finishLocal(s, se.Code, fmt.Errorf("h2 stream %d: %w", se.StreamID, err))
		}
		return
	}
	if c.goAway != nil {
		err = fmt.Errorf("%w; then: %v", c.goAway, err)
	}
	c.fail(fmt.Errorf("h2 connection to %s: %w", c.addr, err))
}

// handle applies one frame. Called with mu held; an error is the
// connection's end.
func (c *clientConn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.HeadersFrame:
		c.hdrID, c.hdrEndStream, c.hf = f.StreamID, f.StreamEnded(), respHeaders{}
		if _, err := c.dec.Write(f.HeaderBlockFragment()); err != nil {
			return fmt.Errorf("%w: %v", http2.ConnectionError(http2.ErrCodeCompression), err)
		}
		if f.HeadersEnded() {
			return c.endHeaders()
		}
	case *http2.ContinuationFrame:
		if _, err := c.dec.Write(f.HeaderBlockFragment()); err != nil {
			return fmt.Errorf("%w: %v", http2.ConnectionError(http2.ErrCodeCompression), err)
		}
		if f.HeadersEnded() {
			return c.endHeaders()
		}
	case *http2.RSTStreamFrame:
		if st := c.lookup(f.StreamID); st != nil {
			st.reset = true
			c.finish(st, false, fmt.Errorf("server reset the stream: RST_STREAM (%v)", f.ErrCode))
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := f.ForeachSetting(c.applySetting); err != nil {
			return err
		}
		if err := c.fr.WriteSettingsAck(); err != nil {
			return err
		}
		if err := c.bw.Flush(); err != nil {
			return err
		}
		c.broadcast()
	case *http2.WindowUpdateFrame:
		inc := int64(f.Increment)
		if f.StreamID == 0 {
			if c.connSendWin += inc; c.connSendWin > h2MaxWindow {
				return fmt.Errorf("%w: connection window over 2^31-1", http2.ConnectionError(http2.ErrCodeFlowControl))
			}
		} else if st := c.lookup(f.StreamID); st != nil {
			if st.sendWin += inc; st.sendWin > h2MaxWindow {
				c.finishLocal(st, http2.ErrCodeFlowControl, errors.New("server overflowed the stream's send window"))
			}
		}
		c.broadcast()
	case *http2.PingFrame:
		if !f.IsAck() {
			if err := c.fr.WritePing(true, f.Data); err != nil {
				return err
			}
			if c.shared {
				return c.bw.Flush()
			}
			c.deferFlush()
		}
	case *http2.GoAwayFrame:
		msg := ""
		if d := f.DebugData(); len(d) > 0 {
			msg = fmt.Sprintf(", %q", d)
		}
		c.goAway = fmt.Errorf("server sent GOAWAY (%v, last stream %d%s)", f.ErrCode, f.LastStreamID, msg)
		c.each(func(st *clientStream) {
			if st.id > f.LastStreamID {
				c.finish(st, false, c.goAway) // not processed
			}
		})
		c.broadcast()
	case *http2.PushPromiseFrame:
		return fmt.Errorf("%w: PUSH_PROMISE with push disabled", http2.ConnectionError(http2.ErrCodeProtocol))
	}
	return nil
}

// onData accounts a DATA frame against the receive windows, topping up the
// connection's, and adds its payload to the stream's response.
func (c *clientConn) onData(f *http2.DataFrame) error {
	if n := int64(f.Length); n > 0 {
		if c.recvAvail -= n; c.recvAvail < 0 {
			return fmt.Errorf("%w: server overran the connection window", http2.ConnectionError(http2.ErrCodeFlowControl))
		}
		if c.recvAvail < c.connWindow/2 {
			if err := c.fr.WriteWindowUpdate(0, uint32(c.connWindow-c.recvAvail)); err != nil {
				return err
			}
			if err := c.bw.Flush(); err != nil {
				return err
			}
			c.recvAvail = c.connWindow
		}
	}
	st := c.lookup(f.StreamID)
	if st == nil {
		return nil // a stream we reset or gave up on
	}
	st.recvd += int64(f.Length)
	switch {
	case st.recvd > c.streamWindow:
		c.finishLocal(st, http2.ErrCodeFlowControl, errors.New("server overran the stream window"))
	case !st.gotHeaders:
		c.finishLocal(st, http2.ErrCodeProtocol, errors.New("DATA before the response HEADERS"))
	case len(st.msg)+len(f.Data()) > maxResponse:
		c.finishLocal(st, http2.ErrCodeCancel, fmt.Errorf("response larger than %d bytes", maxResponse))
	default:
		st.msg = append(st.msg, f.Data()...)
		if f.StreamEnded() {
			st.remoteClosed = true
			c.finish(st, false, errors.New("response ended without trailers (no grpc-status)"))
		}
	}
	return nil
}

// onField is the HPACK decoder's emit function.
func (c *clientConn) onField(f hpack.HeaderField) {
	switch f.Name {
	case ":status":
		c.hf.status = f.Value
	case "content-type":
		c.hf.contentType = f.Value
	case "grpc-status":
		c.hf.grpcStatus, c.hf.hasGRPCStatus = f.Value, true
	case "grpc-message":
		c.hf.grpcMessage = f.Value
	}
}

// endHeaders applies a complete header block: the response headers, the
// trailers, or both at once (trailers-only).
func (c *clientConn) endHeaders() error {
	if err := c.dec.Close(); err != nil {
		return fmt.Errorf("%w: %v", http2.ConnectionError(http2.ErrCodeCompression), err)
	}
	st := c.lookup(c.hdrID)
	if st == nil {
		return nil
	}
	h := &c.hf
	if !st.gotHeaders {
		var err error
		switch {
		case h.status != "200":
			err = fmt.Errorf("HTTP status %q from %s", h.status, rlsPath)
		case !isGRPCContentType(h.contentType):
			err = fmt.Errorf("response content-type %q, want application/grpc", h.contentType)
		}
		if err != nil {
			if h.hasGRPCStatus && h.grpcStatus != "0" {
				_, gerr := callResult(h, nil)
				err = fmt.Errorf("%w (%v)", err, gerr)
			}
			if c.hdrEndStream {
				st.remoteClosed = true
				c.finish(st, false, err)
			} else {
				c.finishLocal(st, http2.ErrCodeCancel, err)
			}
			return nil
		}
		st.gotHeaders = true
		if !c.hdrEndStream {
			return nil // the message and the trailers follow
		}
	} else if !c.hdrEndStream {
		c.finishLocal(st, http2.ErrCodeProtocol, errors.New("trailers without END_STREAM"))
		return nil
	}
	st.remoteClosed = true
	allowed, err := callResult(h, st.msg)
	c.finish(st, allowed, err)
	return nil
}

func isGRPCContentType(ct string) bool {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// callResult reads a call's outcome from its trailers and its gRPC-framed
// response message.
func callResult(h *respHeaders, msg []byte) (allowed bool, err error) {
	if !h.hasGRPCStatus {
		return false, errors.New("response without grpc-status")
	}
	code, err := strconv.ParseUint(h.grpcStatus, 10, 32)
	if err != nil {
		return false, fmt.Errorf("malformed grpc-status %q", h.grpcStatus)
	}
	if code != 0 {
		return false, status.Error(codes.Code(code), decodeGRPCMessage(h.grpcMessage))
	}
	if len(msg) < 5 {
		return false, errors.New("grpc-status 0 without a response message")
	}
	if msg[0] != 0 {
		return false, fmt.Errorf("compressed response (flag %d) not supported", msg[0])
	}
	if n := binary.BigEndian.Uint32(msg[1:5]); uint64(n) != uint64(len(msg)-5) {
		return false, fmt.Errorf("malformed gRPC framing: a %d-byte message in %d bytes", n, len(msg)-5)
	}
	oc, err := rlsOverallCode(msg[5:])
	return oc != int32(rls.RateLimitResponse_OVER_LIMIT), err
}

// rlsOverallCode decodes field 1 (overall_code) of a RateLimitResponse,
// skipping the rest.
func rlsOverallCode(b []byte) (int32, error) {
	var code int32
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("RateLimitResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, fmt.Errorf("RateLimitResponse: %w", protowire.ParseError(n))
			}
			code, b = int32(v), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("RateLimitResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return code, nil
}

// decodeGRPCMessage undoes grpc-message's percent-encoding.
func decodeGRPCMessage(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b = append(b, byte(v))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// appendRLSRequest appends the gRPC-framed (5-byte prefix) protobuf
// encoding of
//
//	RateLimitRequest{Domain: domain, HitsAddend: 1, Descriptors:
//	    [{Entries: [{Key: "client", Value: key}]}]}
//
// to b, by hand: fields in number order, as proto.Marshal writes them.
func appendRLSRequest(b []byte, domain, key string, descriptors int) []byte {
	entry := func(i int) int { // Entry{key=1, value=2}
		n := 1 + protowire.SizeBytes(len(DescriptorKey(i)))
		if key != "" {
			n += 1 + protowire.SizeBytes(len(key))
		}
		return n
	}
	msg := 2 // hits_addend=3
	for i := range descriptors {
		desc := 1 + protowire.SizeBytes(entry(i)) // RateLimitDescriptor{entries=1}
		msg += 1 + protowire.SizeBytes(desc)      // descriptors=2
	}
	if domain != "" {
		msg += 1 + protowire.SizeBytes(len(domain)) // domain=1
	}
	b = append(b, 0, byte(msg>>24), byte(msg>>16), byte(msg>>8), byte(msg))
	if domain != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, domain)
	}
	for i := range descriptors {
		e := entry(i)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(1+protowire.SizeBytes(e)))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(e))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, DescriptorKey(i))
		if key != "" { // proto3 leaves out empty strings
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, key)
		}
	}
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

// applySetting applies one of the server's SETTINGS.
func (c *clientConn) applySetting(s http2.Setting) error {
	if err := s.Valid(); err != nil {
		return fmt.Errorf("%w: %v", err, s)
	}
	switch s.ID {
	case http2.SettingInitialWindowSize:
		delta := int64(s.Val) - c.peerInitWin
		c.peerInitWin = int64(s.Val)
		var err error
		c.each(func(st *clientStream) {
			if st.sendWin += delta; st.sendWin > h2MaxWindow {
				err = fmt.Errorf("%w: stream window over 2^31-1", http2.ConnectionError(http2.ErrCodeFlowControl))
			}
		})
		return err
	case http2.SettingMaxFrameSize:
		c.maxFrame = int(s.Val)
	case http2.SettingMaxConcurrentStreams:
		c.maxStreams = s.Val
	case http2.SettingHeaderTableSize:
		// The server's decoder table: the next block starts with a
		// table size update, and what can be cached may change.
		c.enc.SetMaxDynamicTableSizeLimit(s.Val)
		c.hdrCache, c.encodes = nil, 0
		c.hdrCacheable = c.reqHdrSize <= c.enc.MaxDynamicTableSize()
	}
	return nil
}

// lookup returns the open stream id, or nil. Called with mu held.
func (c *clientConn) lookup(id uint32) *clientStream {
	if c.shared {
		return c.streams[id]
	}
	if c.single != nil && c.single.id == id {
		return c.single
	}
	return nil
}

// each calls fn for every open stream. Called with mu held.
func (c *clientConn) each(fn func(*clientStream)) {
	if c.shared {
		for _, st := range c.streams {
			fn(st)
		}
	} else if c.single != nil {
		fn(c.single)
	}
}

// finish ends st with its outcome. Called with mu held.
func (c *clientConn) finish(st *clientStream, allowed bool, err error) {
	if st.finished {
		return
	}
	st.finished, st.allowed, st.err = true, allowed, err
	if c.shared {
		delete(c.streams, st.id)
		close(st.done)
	} else if c.single == st {
		c.single = nil
	}
	c.active--
	c.broadcast()
	if c.retired && c.active == 0 {
		c.fail(errRetired)
	}
}

// finishLocal ends st on our side: it resets the stream unless the server
// has already ended or reset it. Called with mu held.
func (c *clientConn) finishLocal(st *clientStream, code http2.ErrCode, err error) {
	if st.finished {
		return
	}
	if !st.remoteClosed && !st.reset && c.err == nil {
		st.reset = true
		if werr := c.fr.WriteRSTStream(st.id, code); werr != nil {
			c.fail(werr)
		} else if werr := c.bw.Flush(); werr != nil {
			c.fail(werr)
		}
	}
	c.finish(st, false, err)
}

// fail closes the connection and ends its streams with err. Called with
// mu held.
func (c *clientConn) fail(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if ce := http2.ConnectionError(0); errors.As(err, &ce) {
		// Tell the server why, if it listens within a second.
		c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		c.fr.WriteGoAway(0, http2.ErrCode(ce), nil)
		c.bw.Flush()
	}
	c.nc.Close()
	if c.stopWatch != nil {
		c.stopWatch()
	}
	if !c.shared {
		heldAcks.remove(c)
	}
	c.each(func(st *clientStream) { c.finish(st, false, err) })
	c.broadcast()
}

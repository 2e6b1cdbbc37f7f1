// Package replay runs an access log through a weir.yaml: every request a
// line describes goes through the real policy (package policy: rules,
// identities, tiers, penalty box, shadow, allow and deny lists, all or
// nothing) at the line's own timestamp, on a memory store whose clock is
// the log's. The answer says, per rule, how many requests it would have
// limited and whom. `weir replay` is its command; docs/replay.md the
// user's guide.
//
// The replay is exact: the algorithms are exact functions of microsecond
// time, so a request replayed at the time it was made gets the decision it
// got live, within the precision of the log's timestamps (nginx's
// $time_local has whole seconds).
package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/memstore"
)

// Input is one log to replay.
type Input struct {
	// Name names the input in reports ("-" for stdin).
	Name string
	// R reads the log, plain or gzip-compressed (told by its first bytes).
	R io.Reader
	// Size is R's length in bytes, 0 when unknown; the progress bar
	// uses it.
	Size int64
}

// Options tune a replay.
type Options struct {
	// Format is FormatAuto (or ""), FormatNginx, FormatEnvoy, FormatCaddy
	// or FormatJSONL.
	Format string
	// Fields maps jsonl's names (time, ip, method, uri, path, query,
	// host, status, header:NAME) to JSON fields, dotted for nested ones.
	Fields map[string]string
	// Window is how far out of order a line's timestamp may be and still
	// be decided in order (default DefaultWindow).
	Window time.Duration
	// Progress, when set, receives a progress bar once the replay has
	// taken more than a second.
	Progress io.Writer

	// observe, for tests, sees every decision: the record, the config's
	// index and the verdict. It makes the replay decide on one goroutine.
	observe func(rec *Record, cfg int, v *policy.Verdict)
	// parts, for tests, sets how many goroutines decide when the rules
	// allow several: 0 is up to GOMAXPROCS (at most 2), 1 is one.
	parts int
}

// DefaultWindow is the default out-of-order tolerance.
const DefaultWindow = 5 * time.Second

// maxBuffered and maxBufferedBytes bound the lines held back to be put
// in order, whatever the window: at most this many lines, holding at most
// this many bytes (recBytes), wait.
const (
	maxBuffered      = 1 << 16
	maxBufferedBytes = 32 << 20
)

// batchSize and maxBatchBytes bound a batch of records (or of their
// verdicts) passed between goroutines: it goes when it has batchSize, or
// records holding maxBatchBytes.
const (
	batchSize     = 2048
	maxBatchBytes = 2 << 20
)

// maxListed is how many skipped or late lines a report names.
const maxListed = 10

// LineRef names one line of an input.
type LineRef struct {
	Input string `json:"input"`
	Line  int64  `json:"line"`
	// Error says why the line was skipped; empty for a late line.
	Error string `json:"error,omitempty"`
}

// stats is what reading found, shared by every config's report.
type stats struct {
	format       string
	lines        int64
	skipped      int64
	skippedLines []LineRef
	late         int64
	lateLines    []LineRef
	from, to     int64
}

// input is an opened Input.
type input struct {
	name  string
	br    *bufio.Reader
	count *countReader
	size  int64
}

type countReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// open wraps the inputs, decompressing gzip, and returns the format
// detected from their first lines.
func open(ins []Input, o *Options) ([]*input, *format, error) {
	var out []*input
	var f *format
	for i, in := range ins {
		cr := &countReader{r: in.R}
		br := bufio.NewReaderSize(cr, 64<<10)
		if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %v", in.Name, err)
			}
			br = bufio.NewReaderSize(zr, 1<<20)
		} else {
			br = bufio.NewReaderSize(br, 1<<20)
		}
		head, err := br.Peek(64 << 10)
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
			return nil, nil, fmt.Errorf("%s: %v", in.Name, err)
		}
		lines := strings.Split(string(head), "\n")
		if len(lines) > 20 {
			lines = lines[:20]
		} else if len(lines) > 1 && err == nil {
			lines = lines[:len(lines)-1] // the last may be cut short
		}
		fi, err := detect(o.Format, lines, o.Fields)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", in.Name, err)
		}
		if i == 0 {
			f = fi
		} else if fi.name != f.name && strings.TrimSpace(string(head)) != "" {
			return nil, nil, fmt.Errorf("%s is %s but %s is %s: replay inputs of one format at a time", in.Name, fi.name, ins[0].Name, f.name)
		}
		out = append(out, &input{name: in.Name, br: br, count: cr, size: in.Size})
	}
	if f == nil {
		return nil, nil, errors.New("no input")
	}
	return out, f, nil
}

// sim is one config being replayed.
type sim struct {
	pol *policy.Policy
	now atomic.Int64 // the virtual clock, µs
	t   *tally
}

// newSim builds a sim for run, a prepared config, on a memory store of
// maxKeys keys, counting into t.
func newSim(run *config.Config, maxKeys int, t *tally) (*sim, error) {
	s := &sim{t: t}
	clock := func() time.Time { return time.UnixMicro(s.now.Load()) }
	store := memstore.New(memstore.WithClock(clock), memstore.WithMaxKeys(maxKeys))
	p, err := policy.New(run, store, policy.WithClock(clock))
	if err != nil {
		return nil, err
	}
	s.pol = p
	return s, nil
}

// engine reads the inputs once and decides every line under each config,
// on one worker or, when the rules allow it, on several (partition.go).
type engine struct {
	o       Options
	ins     []*input
	f       *format
	tallies []*tally
	workers []*worker
	part    *partitioner
	st      stats
	window  int64

	// Verdicts go to the tally in batches.
	verdicts chan []decided
	vfree    chan []decided
}

// worker decides the records of one partition, one sim per config.
type worker struct {
	e      *engine
	sims   []*sim
	in     chan []Record
	vbatch []decided
	vbytes int64 // the bytes the records of vbatch hold (recBytes)
	rb     reqBuilder
}

// reqBuilder holds the request every line is turned into, reused.
type reqBuilder struct {
	req  http.Request
	url  url.URL
	hdr  http.Header
	ua   [1]string
	ref  [1]string
	xff  [1]string
	prev []string // the extra headers set for the previous line
}

// Run replays the inputs through every config, reading them once, and
// returns one report per config.
func Run(ctx context.Context, ins []Input, cfgs []*config.Config, o Options) ([]*Report, error) {
	e, err := runEngine(ctx, ins, cfgs, o)
	if err != nil {
		return nil, err
	}
	out := make([]*Report, len(e.tallies))
	for i, t := range e.tallies {
		out[i] = t.report(&e.st)
	}
	return out, nil
}

// runEngine opens the inputs, builds the workers and runs.
func runEngine(ctx context.Context, ins []Input, cfgs []*config.Config, o Options) (*engine, error) {
	opened, f, err := open(ins, &o)
	if err != nil {
		return nil, err
	}
	e := &engine{o: o, ins: opened, f: f}
	var runs []*config.Config
	var maxKeys []int
	for _, c := range cfgs {
		run, skipped, notes := prepare(c, &f.fields)
		mk := memstore.DefaultMaxKeys
		if c.Store.MaxKeys > 0 {
			mk = c.Store.MaxKeys
		}
		t := newTally(run, mk)
		t.notEvaluated, t.notes = skipped, notes
		runs, maxKeys = append(runs, run), append(maxKeys, mk)
		e.tallies = append(e.tallies, t)
	}
	parts := 1
	if o.parts != 1 && o.observe == nil {
		if e.part = newPartitioner(runs, o.parts); e.part != nil {
			parts = e.part.parts
		}
	}
	for p := 0; p < parts; p++ {
		w := &worker{e: e}
		w.rb.hdr = http.Header{}
		for i, run := range runs {
			// The partitions share max_keys: the store's bound holds.
			s, err := newSim(run, max(maxKeys[i]/parts, 1), e.tallies[i])
			if err != nil {
				return nil, err
			}
			w.sims = append(w.sims, s)
		}
		e.workers = append(e.workers, w)
	}
	return e, e.run(ctx)
}

// run reads on one goroutine, decides on one per worker, and tallies on
// another.
func (e *engine) run(ctx context.Context) error {
	e.window = int64(e.o.Window / time.Microsecond)
	if e.window <= 0 {
		e.window = int64(DefaultWindow / time.Microsecond)
	}
	e.st.format = e.f.name
	n := len(e.workers)
	free := make(chan []Record, 6*n)
	for i := 0; i < 6*n; i++ {
		free <- make([]Record, 0, batchSize)
	}
	e.verdicts = make(chan []decided, 4*n)
	e.vfree = make(chan []decided, 6*n)
	for i := 0; i < 6*n; i++ {
		e.vfree <- make([]decided, 0, batchSize)
	}
	for _, w := range e.workers {
		w.in = make(chan []Record, 4)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var readErr error
	var wg, deciders sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			for _, w := range e.workers {
				close(w.in)
			}
		}()
		readErr = e.read(ctx, free)
	}()
	stop := e.progress()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for b := range e.verdicts {
			for i := range b {
				e.tallies[b[i].sim].add(b[i].now, &b[i].v)
			}
			clear(b)
			e.vfree <- b[:0]
		}
	}()
	for _, w := range e.workers {
		deciders.Add(1)
		go func() {
			defer deciders.Done()
			w.run(ctx, free)
		}()
	}
	deciders.Wait()
	close(e.verdicts)
	stop()
	wg.Wait()
	return readErr
}

// run decides every record sent to w.
func (w *worker) run(ctx context.Context, free chan []Record) {
	w.vbatch = <-w.e.vfree
	for b := range w.in {
		for i := range b {
			w.decide(ctx, &b[i])
		}
		clear(b)
		free <- b[:0]
	}
	if len(w.vbatch) > 0 {
		w.e.verdicts <- w.vbatch
	} else {
		w.e.vfree <- w.vbatch
	}
}

// decided is one verdict on its way to the tally.
type decided struct {
	sim int
	now int64
	v   policy.Verdict
}

// read parses every input, puts the records in time order within the
// window, and sends them in batches to their workers.
func (e *engine) read(ctx context.Context, free chan []Record) error {
	ro := reorder{window: e.window, st: &e.st}
	batches := make([][]Record, len(e.workers))
	held := make([]int64, len(e.workers)) // the bytes each batch holds
	for i := range batches {
		batches[i] = <-free
	}
	emit := func(r *Record) {
		p := 0
		if e.part != nil {
			p = e.part.of(r)
		}
		batches[p] = append(batches[p], *r)
		held[p] += recBytes(r)
		if len(batches[p]) == cap(batches[p]) || held[p] >= maxBatchBytes {
			e.workers[p].in <- batches[p]
			batches[p], held[p] = <-free, 0
		}
	}
	for i, in := range e.ins {
		if err := e.readInput(ctx, i, in, &ro, emit); err != nil {
			return err
		}
	}
	ro.flush(emit)
	for p, b := range batches {
		if len(b) > 0 {
			e.workers[p].in <- b
		}
	}
	return nil
}

// readInput parses one input's lines into ro.
func (e *engine) readInput(ctx context.Context, idx int, in *input, ro *reorder, emit func(*Record)) error {
	buf := make([]byte, 0, 1<<20)
	var lineNo int64
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		n, err := io.ReadFull(in.br, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		eof := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !eof {
			return fmt.Errorf("%s: %v", in.name, err)
		}
		end := len(buf)
		if !eof {
			end = bytes.LastIndexByte(buf, '\n') + 1
			if end == 0 && cap(buf) < maxLine {
				// A line longer than the buffer: grow it.
				nb := make([]byte, len(buf), 2*cap(buf))
				copy(nb, buf)
				buf = nb
				continue
			}
			if end == 0 {
				// No log line is this long: skip it, whatever follows
				// up to the next newline, and count it once.
				lineNo++
				e.st.lines++
				e.skip(in.name, lineNo, fmt.Errorf("longer than %d MB", maxLine>>20))
				if err := discardLine(in.br); err != nil {
					return fmt.Errorf("%s: %v", in.name, err)
				}
				buf = buf[:0]
				continue
			}
		}
		chunk := buf[:end]
		for len(chunk) > 0 {
			var lb []byte
			if i := bytes.IndexByte(chunk, '\n'); i >= 0 {
				lb, chunk = chunk[:i], chunk[i+1:]
			} else {
				lb, chunk = chunk, nil
			}
			lineNo++
			lb = bytes.TrimSuffix(lb, []byte{'\r'})
			if len(bytes.TrimSpace(lb)) == 0 {
				continue
			}
			// One string per line: a record held keeps its own line
			// alive, not the rest of what was read with it.
			line := string(lb)
			e.st.lines++
			rec := Record{Line: lineNo, Input: idx}
			if perr := e.f.parse(line, &rec); perr != nil {
				e.skip(in.name, lineNo, perr)
				continue
			}
			ro.push(&rec, e.ins, emit)
		}
		rest := copy(buf, buf[end:])
		buf = buf[:rest]
		if eof {
			return nil
		}
	}
}

// maxLine bounds a line's length: a longer one is skipped, so that a file
// without newlines cannot take unbounded memory.
const maxLine = 4 << 20

// skip counts a line that could not be read.
func (e *engine) skip(input string, line int64, err error) {
	e.st.skipped++
	if len(e.st.skippedLines) < maxListed {
		e.st.skippedLines = append(e.st.skippedLines, LineRef{Input: input, Line: line, Error: err.Error()})
	}
}

// discardLine reads up to and including the next newline.
func discardLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		switch {
		case err == nil, errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return err
		}
	}
}

// reorder puts records in time order within a window: a record is held
// until one at least window later has been read (or maxBuffered are
// held, or they hold maxBufferedBytes). A record older than one already
// decided is late: it is decided at the time of the last one decided, and
// reported.
type reorder struct {
	buf     []Record
	head    int
	bytes   int64 // what the records held hold (recBytes)
	window  int64
	maxSeen int64
	last    int64 // the time of the last record emitted
	started bool
	st      *stats
}

func (ro *reorder) push(r *Record, ins []*input, emit func(*Record)) {
	if ro.started && r.Time < ro.last {
		ro.st.late++
		if len(ro.st.lateLines) < maxListed {
			ro.st.lateLines = append(ro.st.lateLines, LineRef{Input: ins[r.Input].name, Line: r.Line})
		}
		r.Time = ro.last
	}
	// Insert in order, after any record of the same time.
	q := ro.buf[ro.head:]
	i := len(q)
	for i > 0 && q[i-1].Time > r.Time {
		i--
	}
	ro.buf = append(ro.buf, Record{})
	q = ro.buf[ro.head:]
	copy(q[i+1:], q[i:])
	q[i] = *r
	ro.bytes += recBytes(r)
	ro.maxSeen = max(ro.maxSeen, r.Time)
	for ro.head < len(ro.buf) && (ro.buf[ro.head].Time <= ro.maxSeen-ro.window || len(ro.buf)-ro.head > maxBuffered || ro.bytes > maxBufferedBytes) {
		ro.pop(emit)
	}
	if ro.head > 4096 && ro.head*2 > len(ro.buf) {
		n := copy(ro.buf, ro.buf[ro.head:])
		clear(ro.buf[n:])
		ro.buf, ro.head = ro.buf[:n], 0
	}
}

func (ro *reorder) pop(emit func(*Record)) {
	r := &ro.buf[ro.head]
	ro.last, ro.started = r.Time, true
	if ro.st.from == 0 || r.Time < ro.st.from {
		ro.st.from = r.Time
	}
	ro.st.to = max(ro.st.to, r.Time)
	ro.bytes -= recBytes(r)
	emit(r)
	ro.buf[ro.head] = Record{}
	ro.head++
}

func (ro *reorder) flush(emit func(*Record)) {
	for ro.head < len(ro.buf) {
		ro.pop(emit)
	}
	ro.buf, ro.head = nil, 0
}

// decide turns rec into the request and decides it under every sim.
func (w *worker) decide(ctx context.Context, rec *Record) {
	r := w.rb.request(rec)
	for i, s := range w.sims {
		s.now.Store(rec.Time)
		v := s.pol.Check(ctx, r)
		if v.Metered() {
			// cost and count rules settle after the handler: at the
			// estimate (no Charge is logged), and by the logged status.
			_ = s.pol.Finish(ctx, &v, policy.Charges{Status: rec.Status})
		}
		if w.e.o.observe != nil {
			w.e.o.observe(rec, i, &v)
		}
		w.vbatch = append(w.vbatch, decided{i, rec.Time, v})
		if len(w.vbatch) == cap(w.vbatch) {
			w.send()
		}
	}
	// A verdict may hold its record's strings (an identity).
	if w.vbytes += recBytes(rec); w.vbytes >= maxBatchBytes && len(w.vbatch) > 0 {
		w.send()
	}
}

// send passes the verdicts to the tally and takes an empty batch.
func (w *worker) send() {
	w.e.verdicts <- w.vbatch
	w.vbatch, w.vbytes = <-w.e.vfree, 0
}

// request fills the reused request from rec, as net/http's server would
// have parsed it.
func (e *reqBuilder) request(rec *Record) *http.Request {
	r := &e.req
	r.Method, r.Host, r.RemoteAddr, r.RequestURI = rec.Method, rec.Host, rec.Addr, rec.URI
	r.URL = &e.url
	e.url = url.URL{}
	if strings.IndexByte(rec.URI, '%') < 0 && strings.HasPrefix(rec.URI, "/") {
		e.url.Path, e.url.RawQuery, _ = strings.Cut(rec.URI, "?")
	} else if u, err := url.ParseRequestURI(rec.URI); err == nil {
		e.url = *u
		if r.Host == "" {
			r.Host = u.Host
		}
	} else {
		e.url.Path = rec.URI
	}
	h := e.hdr
	set := func(name string, slot *[1]string, v string) {
		if v == "" {
			delete(h, name)
			return
		}
		slot[0] = v
		h[name] = slot[:]
	}
	set("User-Agent", &e.ua, rec.UA)
	set("Referer", &e.ref, rec.Referer)
	set("X-Forwarded-For", &e.xff, rec.XFF)
	for _, name := range e.prev {
		delete(h, name)
	}
	e.prev = e.prev[:0]
	for _, x := range rec.Extra {
		h[x.Name] = []string{x.Value}
		e.prev = append(e.prev, x.Name)
	}
	r.Header = h
	return r
}

// progress draws a bar on o.Progress every quarter second once the replay
// has run for a second; stop ends it and clears the line.
func (e *engine) progress() (stop func()) {
	w := e.o.Progress
	if w == nil {
		return func() {}
	}
	var total int64
	for _, in := range e.ins {
		if in.size <= 0 {
			total = 0
			break
		}
		total += in.size
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	drawn := false
	go func() {
		defer wg.Done()
		start := time.Now()
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			el := time.Since(start)
			if el < time.Second {
				continue
			}
			var read int64
			for _, in := range e.ins {
				read += in.count.n.Load()
			}
			fmt.Fprint(w, "\r"+bar(read, total, el))
			drawn = true
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		if drawn {
			fmt.Fprint(w, "\r\033[K")
		}
	}
}

// bar renders one progress line.
func bar(read, total int64, el time.Duration) string {
	mb := float64(read) / (1 << 20)
	rate := mb / el.Seconds()
	if total <= 0 {
		return fmt.Sprintf("replay: %.0f MB read, %.0f MB/s", mb, rate)
	}
	frac := min(float64(read)/float64(total), 1)
	const width = 30
	n := int(frac * width)
	return fmt.Sprintf("replay [%s%s] %3.0f%%  %.0f/%.0f MB  %.0f MB/s", strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, mb, float64(total)/(1<<20), rate)
}

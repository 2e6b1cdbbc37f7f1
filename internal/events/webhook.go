package events

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Webhook headers.
const (
	// SignatureHeader carries "t=<unix seconds>,v1=<hex HMAC-SHA256 of
	// secret over t + "." + body>".
	SignatureHeader = "Weir-Signature"
	// IdempotencyHeader carries the event's ID: a receiver drops an ID it
	// has seen.
	IdempotencyHeader = "Idempotency-Key"
)

// Delivery results, the result label of weir_webhook_deliveries_total.
const (
	ResultDelivered = "delivered" // a 2xx answer
	ResultFailed    = "failed"    // another answer, or a transport error
	ResultTimeout   = "timeout"   // no answer within the call's timeout
)

// Sign returns the SignatureHeader value of body sent at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret []byte, ts string, body []byte) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Verify checks a SignatureHeader value against body, as a receiver
// does: the HMAC must match and the time be within tolerance of now.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return errors.New("events: malformed signature header")
	}
	if !hmac.Equal([]byte(sig), []byte(mac(secret, ts, body))) {
		return errors.New("events: signature mismatch")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("events: signature time %s is outside the tolerance", time.Unix(sec, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// A Source hands a Deliverer the events to deliver.
type Source interface {
	// Claim returns up to n events not yet acknowledged, oldest first.
	Claim(ctx context.Context, n int) ([]Event, error)
	// Ack marks events delivered (or not to be delivered).
	Ack(ctx context.Context, ids []string) error
}

// Cursor is the Source of one reader of an events.Store: it delivers
// every event the store keeps after Since ("" for the oldest).
type Cursor struct {
	Store Store
	Since string
	mu    sync.Mutex
}

// Claim implements Source.
func (c *Cursor) Claim(ctx context.Context, n int) ([]Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs, err := c.Store.Events(ctx, c.Since, n)
	if err != nil {
		return nil, err
	}
	if len(evs) > 0 {
		c.Since = evs[len(evs)-1].ID
	}
	return evs, nil
}

// Ack implements Source. The cursor moved past what it handed out when
// it did: the Deliverer then holds the events in its receivers' queues.
func (c *Cursor) Ack(ctx context.Context, ids []string) error { return nil }

// A Grouped store shares delivery among the instances of a fleet: each
// event goes to one of them (redisstore, with a Redis consumer group).
type Grouped interface {
	// Group returns the Source of consumer, one instance's name.
	Group(consumer string) Source
}

// Counters receive a Deliverer's counts (weir serve's Prometheus metrics).
type Counters interface {
	Event(kind string)
	Delivery(result string)
	Dropped(n int64)
}

// A Deliverer posts events as webhooks: one JSON Event per POST, signed
// (SignatureHeader) and carrying its ID (IdempotencyHeader), retried with
// exponential backoff and full jitter until the receiver answers 2xx, so
// delivery is at least once. It runs on its own goroutines and reads the
// store's events after the decisions made them: a slow or failing
// receiver delays only delivery, never a decision. Each receiver (URL)
// has its own queue of up to LaneQueue events and its own goroutine, so
// a receiver that hangs delays only its own events. While it waits, the
// store keeps at most its bound of events; what the bound dropped counts
// in Counters.Dropped.
type Deliverer struct {
	Source Source
	// URL returns the webhook of a rule's events, "" for none.
	URL func(rule string) string
	// Secret returns the key webhooks are signed with (it may change on
	// a reload).
	Secret func() []byte
	// Timeout bounds each call (default 5 s).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between tries (default
	// 100 ms and 1 min).
	MinBackoff, MaxBackoff time.Duration
	// Poll is the wait between reads of the store when it has nothing new
	// (default 250 ms).
	Poll     time.Duration
	Client   *http.Client
	Counters Counters
	Log      *slog.Logger
	// Now is the clock of signatures (tests); nil is time.Now.
	Now func() time.Time
	// Requeue says that the Source hands out again, later, an event
	// claimed and never acknowledged (a Redis consumer group): an event
	// whose receiver's queue is full is then left for later; otherwise it
	// is dropped and counted in Counters.Dropped.
	Requeue bool

	lastSeq uint64
}

// batch is how many events a Deliverer claims at once.
const batch = 100

// LaneQueue is the most events a Deliverer holds for one receiver.
const LaneQueue = 10000

// lanes are a Run's receivers' queues and the events in them.
type lanes struct {
	d      *Deliverer
	ctx    context.Context
	wg     sync.WaitGroup
	mu     sync.Mutex
	queues map[string]chan Event
	queued map[string]bool // IDs in a queue or being delivered
}

// add queues e for url; false if url's queue is full.
func (l *lanes) add(url string, e Event) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.queued[e.ID] {
		return true // claimed again while still queued
	}
	q, ok := l.queues[url]
	if !ok {
		q = make(chan Event, LaneQueue)
		l.queues[url] = q
		l.wg.Add(1)
		go l.run(url, q)
	}
	select {
	case q <- e:
		l.queued[e.ID] = true
		return true
	default:
		return false
	}
}

// run delivers url's queue in order until the Run ends.
func (l *lanes) run(url string, q chan Event) {
	defer l.wg.Done()
	d := l.d
	for {
		select {
		case <-l.ctx.Done():
			return
		case e := <-q:
			if !d.deliver(l.ctx, url, &e) {
				return // ctx ended
			}
			if err := d.Source.Ack(l.ctx, []string{e.ID}); err != nil && d.Log != nil && l.ctx.Err() == nil {
				d.Log.Warn("events: acknowledging failed", "err", err)
			}
			l.mu.Lock()
			delete(l.queued, e.ID)
			l.mu.Unlock()
		}
	}
}

// Run delivers until ctx ends.
func (d *Deliverer) Run(ctx context.Context) {
	poll := cmp(d.Poll, 250*time.Millisecond)
	ls := &lanes{d: d, ctx: ctx, queues: map[string]chan Event{}, queued: map[string]bool{}}
	defer ls.wg.Wait()
	for ctx.Err() == nil {
		evs, err := d.Source.Claim(ctx, batch)
		if err != nil {
			if d.Log != nil && ctx.Err() == nil {
				d.Log.Warn("events: reading the store failed", "err", err)
			}
			sleep(ctx, poll)
			continue
		}
		if len(evs) == 0 {
			sleep(ctx, poll)
			continue
		}
		ids := make([]string, 0, len(evs))
		full := false
		for i := range evs {
			e := &evs[i]
			if e.Seq > 0 {
				if d.lastSeq > 0 && e.Seq > d.lastSeq+1 && d.Counters != nil {
					d.Counters.Dropped(int64(e.Seq - d.lastSeq - 1))
				}
				d.lastSeq = max(d.lastSeq, e.Seq)
			}
			if d.Counters != nil {
				d.Counters.Event(e.Kind)
			}
			url := d.URL(e.Rule)
			if url == "" {
				ids = append(ids, e.ID)
				continue
			}
			if !ls.add(url, *e) {
				full = true
				if !d.Requeue {
					if d.Counters != nil {
						d.Counters.Dropped(1)
					}
					ids = append(ids, e.ID)
				}
			}
		}
		if err := d.Source.Ack(ctx, ids); err != nil && d.Log != nil && ctx.Err() == nil {
			d.Log.Warn("events: acknowledging failed", "err", err)
		}
		if full {
			sleep(ctx, poll) // a receiver is behind: let its queue drain
		}
	}
}

// deliver posts e to url until it is accepted; false if ctx ended first.
func (d *Deliverer) deliver(ctx context.Context, url string, e *Event) bool {
	body, _ := json.Marshal(e)
	minB, maxB := cmp(d.MinBackoff, 100*time.Millisecond), cmp(d.MaxBackoff, time.Minute)
	for try := 0; ; try++ {
		res := d.post(ctx, url, e.ID, body)
		if d.Counters != nil && ctx.Err() == nil {
			d.Counters.Delivery(res)
		}
		if res == ResultDelivered {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		back := minB << min(try, 30)
		if back <= 0 || back > maxB {
			back = maxB
		}
		// Full jitter: a fleet of deliverers does not retry in step.
		if !sleep(ctx, time.Duration(rand.Int64N(int64(back))+1)) {
			return false
		}
	}
}

// post makes one call and returns its result.
func (d *Deliverer) post(ctx context.Context, url, id string, body []byte) string {
	ctx, cancel := context.WithTimeout(ctx, cmp(d.Timeout, 5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return ResultFailed
	}
	now := time.Now
	if d.Now != nil {
		now = d.Now
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(d.Secret(), now(), body))
	req.Header.Set(IdempotencyHeader, id)
	client := d.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ResultTimeout
		}
		return ResultFailed
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return ResultDelivered
	}
	return ResultFailed
}

func cmp(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

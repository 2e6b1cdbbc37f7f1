package guard

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// recordingHandler keeps every slog record's message, level and attributes.
type recordingHandler struct {
	mu   sync.Mutex
	recs []loggedRecord
}

type loggedRecord struct {
	msg   string
	level slog.Level
	attrs map[string]slog.Value
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	rec := loggedRecord{msg: r.Message, level: r.Level, attrs: map[string]slog.Value{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value; return true })
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

// byMsg returns the records whose message is msg.
func (h *recordingHandler) byMsg(msg string) []loggedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []loggedRecord
	for _, r := range h.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

func (h *recordingHandler) all() []loggedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]loggedRecord(nil), h.recs...)
}

// TestOutageLoggedOncePerMinute: a store down for 10 minutes, probed every
// second by the half-open breaker, with calls refused by the open breaker
// and decided by the fallback in between, logs one line when the outage
// starts, one a minute while it lasts, with its counts, and one when it
// ends, with its duration. (Before, every failed probe logged its
// transitions, and the guard its failures every 10 s.)
func TestOutageLoggedOncePerMinute(t *testing.T) {
	const (
		outageStarted = "weir: store outage started; rules fall back to their on_error policy"
		stillDown     = "weir: store still down"
		outageEnded   = "weir: store outage ended; the store answers again"
	)
	clock := newClock()
	store := newFakeStore(clock)
	h := &recordingHandler{}
	g := New(store, Config{
		Timeout: time.Second,
		Breaker: BreakerConfig{Failures: 1, Cooldown: time.Second, FailureRatio: 2},
		Now:     clock.Now,
		Logger:  slog.New(h),
	})
	l := weir.PerMinute(weir.GCRA, 100)
	reqs := []weir.Request{{Key: "k", Limit: l, N: 1}}
	res := make([]weir.Result, 1)
	// call is one request: the store decides it, or the fallback does.
	call := func() error {
		_, err := g.Take(ctx, "k", l, 1)
		if err != nil {
			if ferr := g.Fallback(ctx, Local, reqs, res, 1); ferr != nil {
				t.Fatal(ferr)
			}
		}
		return err
	}

	store.Down.Store(true)
	start := clock.Now()
	if err := call(); !errors.Is(err, errDown) {
		t.Fatalf("first failure: %v", err)
	}
	const (
		outage = 10 * time.Minute
		minute = time.Minute // the time between two still-down lines
	)
	probes, refused := 0, 0
	for clock.Now().Sub(start) < outage {
		clock.Advance(time.Second)
		// The probe fails; the calls after it are refused by the breaker.
		if err := call(); !errors.Is(err, errDown) {
			t.Fatalf("probe at %v: %v", clock.Now().Sub(start), err)
		}
		probes++
		for i := 0; i < 2; i++ {
			if err := call(); !errors.Is(err, ErrCircuitOpen) {
				t.Fatalf("open at %v: %v", clock.Now().Sub(start), err)
			}
			refused++
		}
	}
	store.Down.Store(false)
	clock.Advance(time.Second)
	if err := call(); err != nil || g.State() != BreakerClosed {
		t.Fatalf("recovery: %v, breaker %v", err, g.State())
	}
	duration := clock.Now().Sub(start)

	if n := len(h.byMsg(outageStarted)); n != 1 {
		t.Errorf("%d %q lines, want 1", n, outageStarted)
	}
	still := h.byMsg(stillDown)
	if want := int(outage / minute); len(still) != want {
		t.Errorf("%d %q lines in a %v outage, want %d (one a minute)", len(still), stillDown, outage, want)
	}
	for i, r := range still {
		minutes := time.Duration(i+1) * minute
		secs := uint64(minutes / time.Second)
		// The line comes with the first call of its second, the probe,
		// before that second's calls count: before it, the failure that
		// started the outage and one failed probe, two refusals and three
		// fallbacks a second.
		if d := r.attrs["duration"].Duration(); d != minutes {
			t.Errorf("still-down line %d: duration %v, want %v", i, d, minutes)
		}
		if f := r.attrs["failures"].Uint64(); f != secs {
			t.Errorf("still-down line %d: %d failures, want %d", i, f, secs)
		}
		if n := r.attrs["rejected"].Uint64(); n != 2*(secs-1) {
			t.Errorf("still-down line %d: %d rejected, want %d", i, n, 2*(secs-1))
		}
		if n := r.attrs["fallbacks"].Uint64(); n != 3*(secs-1)+1 {
			t.Errorf("still-down line %d: %d fallbacks, want %d", i, n, 3*(secs-1)+1)
		}
		if r.level != slog.LevelWarn {
			t.Errorf("still-down line %d at level %v", i, r.level)
		}
	}
	ended := h.byMsg(outageEnded)
	if len(ended) != 1 {
		t.Errorf("%d %q lines, want 1", len(ended), outageEnded)
	} else {
		e := ended[0].attrs
		if d := e["duration"].Duration(); d != duration {
			t.Errorf("outage ended after %v, want %v", d, duration)
		}
		if f, n, fb := e["failures"].Uint64(), e["rejected"].Uint64(), e["fallbacks"].Uint64(); f != uint64(probes+1) || n != uint64(refused) || fb != uint64(probes+refused+1) {
			t.Errorf("outage ended with %d failures, %d rejected, %d fallbacks; want %d, %d, %d", f, n, fb, probes+1, refused, probes+refused+1)
		}
	}
	// Nothing else: the three kinds of lines are all an outage logs.
	if all := h.all(); len(all) != 1+len(still)+1 {
		counts := map[string]int{}
		for _, r := range all {
			counts[r.msg]++
		}
		t.Errorf("%d log lines for a %v outage, want %d: %v", len(all), outage, 2+len(still), counts)
	}
}

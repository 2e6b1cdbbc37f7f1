package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/internal/redistest"
)

const eventsConfig = `
events:
  secret_env: HOOK_SECRET
  thresholds: [0.5, 1.0]
rules:
  - name: api
    identity: [header:X-API-Key]
    limit: 4/h
    algorithm: fixed_window
    events:
      webhook: %s
  - name: quiet
    identity: [header:X-API-Key]
    limit: 4/h
    algorithm: fixed_window
`

func TestEventsServe(t *testing.T) {
	const secret = "hook-secret-value"
	var mu sync.Mutex
	var got []events.Event
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := events.Verify([]byte(secret), r.Header.Get(events.SignatureHeader), body, time.Now(), time.Hour); err != nil {
			t.Errorf("webhook: %v", err)
			return
		}
		var e events.Event
		if err := json.Unmarshal(body, &e); err != nil || r.Header.Get(events.IdempotencyHeader) != e.ID {
			t.Errorf("webhook body %s, key %q: %v", body, r.Header.Get(events.IdempotencyHeader), err)
		}
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}))
	defer hook.Close()
	env := func(k string) (string, bool) {
		if k == "HOOK_SECRET" {
			return secret, true
		}
		return "", false
	}
	_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(eventsConfig, hook.URL))), WithAdminToken(token), WithLookupEnv(env),
		func(o *options) { o.eventPoll, o.webhookBackoff = time.Millisecond, time.Millisecond })
	for range 6 {
		check(t, ts.URL, "api", "alice", 1)
		check(t, ts.URL, "quiet", "alice", 1)
	}
	resp, b := call(t, "GET", ts.URL+"/v1/events", "", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, b)
	}
	var list struct {
		Events []events.Event
		Next   string
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind string
		th   float64
	}{{events.KindThreshold, 0.5}, {events.KindThreshold, 1}, {events.KindRefused, 0}}
	if len(list.Events) != len(want) {
		t.Fatalf("events %s; want %d", b, len(want))
	}
	for i, w := range want {
		e := list.Events[i]
		if e.Rule != "api" || e.Key != "alice" || e.Kind != w.kind || e.Threshold != w.th {
			t.Fatalf("event %d is %+v, want %s %v of api alice", i, e, w.kind, w.th)
		}
	}
	if list.Next != list.Events[2].ID {
		t.Fatalf("next %q, want the last id %q", list.Next, list.Events[2].ID)
	}
	// since= pages.
	_, b = call(t, "GET", ts.URL+"/v1/events?limit=1&since="+list.Events[0].ID, "", bearer(token)...)
	var page struct{ Events []events.Event }
	json.Unmarshal(b, &page)
	if len(page.Events) != 1 || page.Events[0].ID != list.Events[1].ID {
		t.Fatalf("page after the first: %s", b)
	}
	_, b = call(t, "GET", ts.URL+"/v1/events?since="+list.Next, "", bearer(token)...)
	json.Unmarshal(b, &page)
	if len(page.Events) != 0 {
		t.Fatalf("page after the last: %s", b)
	}
	for _, q := range []string{"since=nonsense", "limit=0", "limit=1001", "limit=x"} {
		if resp, b := call(t, "GET", ts.URL+"/v1/events?"+q, "", bearer(token)...); resp.StatusCode != 400 {
			t.Errorf("?%s: %d %s, want 400", q, resp.StatusCode, b)
		}
	}
	if resp, _ := call(t, "GET", ts.URL+"/v1/events", ""); resp.StatusCode != 401 {
		t.Errorf("without the token: %d, want 401", resp.StatusCode)
	}
	eventually(t, 30*time.Second, "the webhook gets the three events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 3
	})
	mu.Lock()
	for i := range 3 {
		if got[i].ID != list.Events[i].ID {
			t.Errorf("webhook %d: %+v, want %+v", i, got[i], list.Events[i])
		}
	}
	mu.Unlock()
	_, m := call(t, "GET", ts.URL+"/metrics", "")
	for _, line := range []string{`weir_events_total{kind="threshold"} 2`, `weir_events_total{kind="refused"} 1`, `weir_webhook_deliveries_total{result="delivered"} 3`, `weir_events_dropped_total 0`} {
		if !strings.Contains(string(m), line) {
			t.Errorf("metrics lack %s", line)
		}
	}
}

// A webhook without its secret is refused, naming the variable and never
// showing a value.
func TestEventsServeSecretMissing(t *testing.T) {
	_, err := New(WithConfig(mustParse(t, fmt.Sprintf(eventsConfig, "https://hooks.example.com/x"))), WithLogger(quietLogger()), WithAdminToken(""),
		WithLookupEnv(func(string) (string, bool) { return "", false }))
	if err == nil || !strings.Contains(err.Error(), "HOOK_SECRET") {
		t.Fatalf("New = %v, want an error naming HOOK_SECRET", err)
	}
}

// Two instances on one Redis: a key's crossings, decided on both, fire
// once each; the instances share delivery through the consumer group, and
// a receiver failing every other call still gets every event.
func TestEventsServeRedis(t *testing.T) {
	r := redistest.Standalone(t)
	const secret = "hook-secret-value"
	var mu sync.Mutex
	got := map[string]int{}
	var calls atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if err := events.Verify([]byte(secret), req.Header.Get(events.SignatureHeader), body, time.Now(), time.Hour); err != nil {
			t.Errorf("webhook: %v", err)
		}
		if calls.Add(1)%2 == 1 {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		got[req.Header.Get(events.IdempotencyHeader)]++
		mu.Unlock()
	}))
	defer hook.Close()
	env := func(k string) (string, bool) { return secret, k == "HOOK_SECRET" }
	cfg := fmt.Sprintf(eventsConfig, hook.URL) + "store:\n  timeout: 2s\n"
	opts := []Option{WithConfig(mustParse(t, cfg)), WithLookupEnv(env), func(o *options) { o.eventPoll, o.webhookBackoff = time.Millisecond, time.Millisecond }}
	_, baseA := newRedisServer(t, r.Addr, "a", opts...)
	_, baseB := newRedisServer(t, r.Addr, "b", opts...)
	var wg sync.WaitGroup
	for i := range 20 {
		for j := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := checkFresh([]string{baseA, baseB}[j%2], "api", fmt.Sprint("k", i)); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	_, b := call(t, "GET", baseB+"/v1/events?limit=1000", "", bearer(token)...)
	var list struct{ Events []events.Event }
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Events) != 60 {
		t.Fatalf("%d events, want 60 (two thresholds and a refusal for each of 20 keys)", len(list.Events))
	}
	eventually(t, 60*time.Second, "every event delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 60
	})
	mu.Lock()
	defer mu.Unlock()
	for _, e := range list.Events {
		if got[e.ID] == 0 {
			t.Fatalf("event %s not delivered", e.ID)
		}
	}
}

const boxedEventsConfig = `
events:
  thresholds: [0.5, 1.0]
rules:
  - name: boxed
    identity: [header:X-API-Key]
    limit: 2/d
    algorithm: fixed_window
    block: 1h
    events: true
store:
  timeout: 10s
`

// DELETE /v1/state clears the identity's event markers with its state:
// its thresholds and first refusal fire again, and the penalty box it
// clears is announced left, once.
func TestEventsStateDelete(t *testing.T) {
	run := func(t *testing.T, base string) {
		for range 3 {
			check(t, base, "boxed", "alice", 1)
		}
		resp, b := call(t, "DELETE", base+"/v1/state?rule=boxed&key=alice", "", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("DELETE /v1/state: %d %s", resp.StatusCode, b)
		}
		for range 3 {
			check(t, base, "boxed", "alice", 1)
		}
		resp, b = call(t, "GET", base+"/v1/events", "", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, b)
		}
		var list struct{ Events []events.Event }
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, e := range list.Events {
			if e.Key != "alice" || e.Rule != "boxed" {
				t.Fatalf("event %+v", e)
			}
			k := e.Kind
			if k == events.KindThreshold {
				k += fmt.Sprint(e.Threshold)
			}
			kinds = append(kinds, k)
		}
		want := "threshold0.5 threshold1 refused blocked unblocked threshold0.5 threshold1 refused blocked"
		if got := strings.Join(kinds, " "); got != want {
			t.Fatalf("events:\n got %s\nwant %s", got, want)
		}
	}
	t.Run("memory", func(t *testing.T) {
		_, ts := newTestServer(t, WithConfig(mustParse(t, boxedEventsConfig)), WithAdminToken(token))
		run(t, ts.URL)
	})
	t.Run("redis", func(t *testing.T) {
		r := redistest.Standalone(t)
		_, base := newRedisServer(t, r.Addr, "a", WithConfig(mustParse(t, boxedEventsConfig)))
		run(t, base)
	})
}

const sweptEventsConfig = `
events:
  thresholds: [1.0]
rules:
  - name: boxed
    identity: [header:X-API-Key]
    limit: 1/d
    algorithm: fixed_window
    block: 1s
    events: true
store:
  timeout: 10s
`

// weir serve's sweeper announces a penalty box's end and an override's
// expiry, with no decision on the identity, once across two instances on
// Redis.
func TestEventsSweptByServe(t *testing.T) {
	fast := func(o *options) { o.eventPoll = 5 * time.Millisecond }
	list := func(t *testing.T, base string) map[string][]events.Event {
		t.Helper()
		resp, b := call(t, "GET", base+"/v1/events?limit=1000", "", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/events: %d %s", resp.StatusCode, b)
		}
		var l struct{ Events []events.Event }
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		by := map[string][]events.Event{}
		for _, e := range l.Events {
			by[e.Kind] = append(by[e.Kind], e)
		}
		return by
	}
	run := func(t *testing.T, bases []string) {
		check(t, bases[0], "boxed", "alice", 1)
		check(t, bases[0], "boxed", "alice", 1) // refused: a box of 1s
		until := time.Now().Add(3 * time.Second).UTC().Truncate(time.Second)
		if status, d := putOverride(t, bases[len(bases)-1], map[string]any{"rule": "boxed", "key": "bob", "limit": "5/d", "until": until.Format(time.RFC3339)}); status != 200 {
			t.Fatalf("override: %d %v", status, d)
		}
		// Polled with a generous bound (a loaded machine), never a timing
		// assertion.
		for end := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			by := list(t, bases[0])
			if len(by[events.KindUnblocked]) > 0 && len(by[events.KindOverrideExpired]) > 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("no unblocked or override_expired event: %v", by)
			}
		}
		// More sweeps run on every instance meanwhile; still one of each.
		time.Sleep(200 * time.Millisecond)
		by := list(t, bases[0])
		if len(by[events.KindBlocked]) != 1 || len(by[events.KindUnblocked]) != 1 || len(by[events.KindOverrideExpired]) != 1 {
			t.Fatalf("events %v", by)
		}
		b, u := by[events.KindBlocked][0], by[events.KindUnblocked][0]
		if b.Key != "alice" || u.Key != "alice" || !u.Time.After(b.Time) {
			t.Fatalf("blocked %+v, unblocked %+v", b, u)
		}
		if o := by[events.KindOverrideExpired][0]; o.Key != "bob" || o.Rule != "boxed" || !o.Time.Equal(until) {
			t.Fatalf("override_expired %+v, want bob at %v", o, until)
		}
	}
	t.Run("memory", func(t *testing.T) {
		_, ts := newTestServer(t, WithConfig(mustParse(t, sweptEventsConfig)), WithAdminToken(token), fast)
		run(t, []string{ts.URL})
	})
	t.Run("redis", func(t *testing.T) {
		r := redistest.Standalone(t)
		_, a := newRedisServer(t, r.Addr, "a", WithConfig(mustParse(t, sweptEventsConfig)), fast)
		_, b := newRedisServer(t, r.Addr, "b", WithConfig(mustParse(t, sweptEventsConfig)), fast)
		run(t, []string{a, b})
	})
}

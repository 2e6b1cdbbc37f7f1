package server

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// debtRules: a token budget per key (token_bucket, 100 a minute, and a
// fixed_window) and a rule whose algorithm has no debt.
const debtRules = `
rules:
  - name: tokens
    limit: 100/m
    algorithm: token_bucket
  - name: daily
    limit: 1000/d
    algorithm: fixed_window
  - name: slots
    limit: 3/m
    algorithm: concurrency
`

func post(t *testing.T, url, body string) (int, map[string]any, string) {
	t.Helper()
	resp, b := call(t, "POST", url, body, "Content-Type", "application/json")
	var d map[string]any
	if strings.HasPrefix(strings.TrimSpace(string(b)), "{") {
		d = decode(t, b)
	}
	return resp.StatusCode, d, string(b)
}

func TestCheckModesAndReservations(t *testing.T) {
	_, ts := newTestServer(t, WithConfig(mustParse(t, debtRules)))
	debtService(t, ts.URL)
}

func TestCheckModesAndReservationsRedis(t *testing.T) {
	r := redistest.Standalone(t)
	_, base := newRedisServer(t, r.Addr, "a", WithConfig(mustParse(t, debtRules+"store:\n  timeout: 2s\n")))
	debtService(t, base)
}

func TestReservationsRedisCluster(t *testing.T) {
	c := redistest.Cluster(t)
	_, base := newRedisServer(t, "", "a", WithConfig(mustParse(t, debtRules+"store:\n  timeout: 2s\n")), WithRedisURL(strings.Join(c.Addrs, ",")))
	debtService(t, base)
}

func debtService(t *testing.T, base string) {
	remaining := func(d map[string]any) int64 { return int64(d["remaining"].(float64)) }
	// A debit past the limit: always counted, allowed false, remaining 0.
	code, d, b := post(t, base+"/v1/check", `{"rule":"tokens","key":"k","hits":150,"mode":"debit"}`)
	if code != 200 || d["allowed"] != false || remaining(d) != 0 || d["retry_after_ms"].(float64) != 30_600 {
		t.Fatalf("debit 150 of 100: %d %s (want retry 30.6s: 51 tokens at 0.6s each)", code, b)
	}
	if _, d, b = post(t, base+"/v1/check", `{"rule":"tokens","key":"k","hits":0}`); d["allowed"] != false {
		t.Fatalf("a key in debt admits: %s", b)
	}
	// A refund pays the debt back, never past empty.
	if _, d, b = post(t, base+"/v1/check", `{"rule":"tokens","key":"k","hits":1000,"mode":"refund"}`); d["allowed"] != true || remaining(d) != 100 {
		t.Fatalf("refund 1000: %s", b)
	}
	// Reserve 40, settle at 25: 15 back, 75 remain.
	code, d, b = post(t, base+"/v1/reserve", `{"rule":"tokens","key":"r","estimate":40}`)
	id, _ := d["reservation"].(string)
	if code != 200 || d["allowed"] != true || remaining(d) != 60 || len(id) != 32 {
		t.Fatalf("reserve 40: %d %s", code, b)
	}
	if code, d, b = post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":25}`, id)); code != 200 || remaining(d) != 75 {
		t.Fatalf("settle 25 of 40: %d %s", code, b)
	}
	// Settling twice, or an unknown id, is a 404 naming the id; nothing changes.
	for _, bad := range []string{id, "0123456789abcdef0123456789abcdef"} {
		code, d, b = post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":1000}`, bad))
		if code != 404 || d["error"] != "unknown_reservation" || !strings.Contains(b, bad) {
			t.Fatalf("settle %s again: %d %s", bad, code, b)
		}
	}
	if _, d, _ = post(t, base+"/v1/check", `{"rule":"tokens","key":"r","hits":0}`); remaining(d) != 75 {
		t.Fatalf("a refused settle changed the state: %v", d)
	}
	// A settlement above the estimate debits; a rejected reserve has no id.
	_, d, _ = post(t, base+"/v1/reserve", `{"rule":"tokens","key":"r","estimate":70}`)
	id2, _ := d["reservation"].(string)
	if _, d, b = post(t, base+"/v1/settle", fmt.Sprintf(`{"reservation":%q,"actual":90}`, id2)); d["allowed"] != false || remaining(d) != 0 {
		t.Fatalf("settle 90 of 70 with 5 left: %s", b)
	}
	if _, d, b = post(t, base+"/v1/reserve", `{"rule":"tokens","key":"r","estimate":1}`); d["allowed"] != false || d["reservation"] != "" {
		t.Fatalf("reserve in debt: %s", b)
	}
	// Windows take debt too.
	if _, d, b = post(t, base+"/v1/check", `{"rule":"daily","key":"k","hits":1500,"mode":"debit"}`); d["allowed"] != false || remaining(d) != 0 {
		t.Fatalf("daily debit: %s", b)
	}
	// Bad input: a clear 4xx naming the value, and nothing changed.
	for _, c := range []struct{ path, body, want string }{
		{"/v1/check", `{"rule":"tokens","key":"b","hits":5,"mode":"steal"}`, "steal"},
		{"/v1/check", `{"rule":"slots","key":"b","hits":1,"mode":"debit"}`, "concurrency"},
		{"/v1/check", `{"rule":"tokens","key":"b","hits":-5,"mode":"refund"}`, "-5"},
		{"/v1/check", `{"rule":"tokens","key":"b","hits":2.5,"mode":"debit"}`, "hits"},
		{"/v1/reserve", `{"rule":"slots","key":"b","estimate":1}`, "concurrency"},
		{"/v1/reserve", `{"rule":"tokens","key":"b","estimate":-1}`, "-1"},
		{"/v1/reserve", `{"rule":"tokens","key":"b","estimate":0}`, "1 or more"}, // free, yet kept: a flood of them would fill the store
		{"/v1/reserve", `{"rule":"tokens","key":"b","estimate":1.5}`, "estimate"},
		{"/v1/reserve", `{"rule":"tokens","key":"b"}`, "estimate"},
		{"/v1/settle", `{"reservation":"x","actual":-3}`, "-3"},
		{"/v1/settle", `{"reservation":"x","actual":0.5}`, "actual"},
		{"/v1/settle", `{"actual":3}`, "reservation"},
	} {
		code, _, b := post(t, base+c.path, c.body)
		if code < 400 || code >= 500 || !strings.Contains(b, c.want) {
			t.Errorf("%s %s: %d %s, want a 4xx naming %s", c.path, c.body, code, b, c.want)
		}
	}
	if _, d, _ = post(t, base+"/v1/check", `{"rule":"tokens","key":"b","hits":0}`); remaining(d) != 100 {
		t.Fatalf("bad input changed the state: %v", d)
	}
}

// notSentStore is a memstore whose debits and refunds fail before they
// are sent while fail is set.
type notSentStore struct {
	weir.Store
	fail atomic.Bool
}

func (s *notSentStore) Do(ctx context.Context, reqs []weir.Request, out []weir.Result) error {
	if s.fail.Load() && len(reqs) == 1 && reqs[0].Mode != weir.ModeTake {
		return fmt.Errorf("test: %w", weir.ErrNotSent)
	}
	return s.Store.Do(ctx, reqs, out)
}

// TestSettleKeptWhenNotSent: a settlement the store never saw keeps its
// reservation (503), so that a retry settles it; once the store is back,
// the retry settles it exactly once.
func TestSettleKeptWhenNotSent(t *testing.T) {
	st := &notSentStore{Store: memstore.New()}
	_, ts := newTestServer(t, WithStore(st), WithConfig(mustParse(t, debtRules+"store:\n  on_error: deny\n")))
	_, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"tokens","key":"k","estimate":50}`)
	id, _ := d["reservation"].(string)
	if id == "" {
		t.Fatalf("reserve: %s", b)
	}
	st.fail.Store(true)
	if code, _, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":10}`); code != 503 || !strings.Contains(b, "kept") {
		t.Fatalf("settle while the store fails before sending: %d %s, want 503 and the reservation kept", code, b)
	}
	st.fail.Store(false)
	if code, _, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":10}`); code != 200 {
		t.Fatalf("the retry: %d %s", code, b)
	}
	if _, d, _ = post(t, ts.URL+"/v1/check", `{"rule":"tokens","key":"k","hits":0}`); int64(d["remaining"].(float64)) != 90 {
		t.Fatalf("after settling 50 at 10: %v remaining, want 90", d["remaining"])
	}
	if code, _, _ := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":10}`); code != 404 {
		t.Fatalf("a second settle: %d, want 404", code)
	}
}

// TestSettleLate: /v1/settle refunds with the take's time. A
// fixed window of 10 a minute: 10 reserved at 0:59, others take 10 at
// 1:01 (the next window), the reservation settles at 0: nothing comes
// back, so the window admits 10, not 20. A record without the take's time
// (an older weir's) settles as before, into the state as it is.
func TestSettleLate(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	srv, ts := newTestServer(t, WithStore(ms), WithConfig(mustParse(t, `
rules:
  - name: tpm
    limit: 10/m
    algorithm: fixed_window
`)))
	remaining := func(d map[string]any) int64 { return int64(d["remaining"].(float64)) }
	clock.Set(storetest.Epoch.Add(59 * time.Second))
	_, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"tpm","key":"k","estimate":10}`)
	id, _ := d["reservation"].(string)
	if id == "" {
		t.Fatalf("reserve: %s", b)
	}
	clock.Set(storetest.Epoch.Add(61 * time.Second))
	if _, d, b = post(t, ts.URL+"/v1/check", `{"rule":"tpm","key":"k","hits":10}`); d["allowed"] != true {
		t.Fatalf("10 in the next window: %s", b)
	}
	if code, d, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":0}`); code != 200 || remaining(d) != 0 {
		t.Fatalf("a late settle at 0: %d %s, want 0 remaining", code, b)
	}
	if _, d, b = post(t, ts.URL+"/v1/check", `{"rule":"tpm","key":"k","hits":1}`); d["allowed"] != false {
		t.Fatalf("the window admitted past 10 after a late settle: %s", b)
	}
	// An old record, without "at": the refund goes into the state as it is.
	rec := []byte(`{"rule":"tpm","key":"k","estimate":10}`)
	if err := srv.resv.put(context.Background(), "old", rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if code, d, b := post(t, ts.URL+"/v1/settle", `{"reservation":"old","actual":4}`); code != 200 || remaining(d) != 6 {
		t.Fatalf("an undated record's settle: %d %s, want 6 remaining (today's behaviour)", code, b)
	}
}

// TestSettleLateLeased: a reservation on a rule with a lease is dated too.
// A fixed window of 10 a minute with lease 5: 10 reserved at 0:59, others
// take 10 at 1:01 (the next window), the reservation settles at 0:
// nothing comes back, so the window admits 10, not 20.
func TestSettleLateLeased(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	_, ts := newTestServer(t, WithStore(ms), WithConfig(mustParse(t, `
rules:
  - name: tpm
    limit: 10/m
    algorithm: fixed_window
    lease: 5
`)))
	clock.Set(storetest.Epoch.Add(59 * time.Second))
	_, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"tpm","key":"k","estimate":10}`)
	id, _ := d["reservation"].(string)
	if id == "" {
		t.Fatalf("reserve: %s", b)
	}
	clock.Set(storetest.Epoch.Add(61 * time.Second))
	admitted := 0
	for range 10 {
		if _, d, _ = post(t, ts.URL+"/v1/check", `{"rule":"tpm","key":"k","hits":1}`); d["allowed"] == true {
			admitted++
		}
	}
	if code, _, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":0}`); code != 200 {
		t.Fatalf("a late settle at 0: %d %s", code, b)
	}
	for range 10 {
		if _, d, _ = post(t, ts.URL+"/v1/check", `{"rule":"tpm","key":"k","hits":1}`); d["allowed"] == true {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("the window after a late settle admitted %d, want 10", admitted)
	}
}

// TestReservationRecordBounded: an open reservation keeps what its
// settlement needs, not the identity: a reservation for an identity of
// 63 KB (nearly as much as a body holds) is a record of a few hundred
// bytes, and it settles the state of that identity.
func TestReservationRecordBounded(t *testing.T) {
	srv, ts := newTestServer(t, WithConfig(mustParse(t, debtRules)))
	key := strings.Repeat("k", 64<<10-1200)
	_, d, b := post(t, ts.URL+"/v1/reserve", `{"rule":"tokens","key":"`+key+`","estimate":40,"tier":"`+strings.Repeat("t", 1000)+`"}`) // the tier names none of the rule
	id, _ := d["reservation"].(string)
	if id == "" {
		t.Fatalf("reserve: %.200s", b)
	}
	rec, ok, err := srv.resv.take(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("the record: %v %v", ok, err)
	}
	if len(rec) > 256 {
		t.Fatalf("an open reservation for a %d-byte identity keeps %d bytes, want at most 256: %.300s", len(key), len(rec), rec)
	}
	if err := srv.resv.put(context.Background(), id, rec, time.Minute); err != nil {
		t.Fatal(err)
	}
	if code, d, b := post(t, ts.URL+"/v1/settle", `{"reservation":"`+id+`","actual":25}`); code != 200 || d["remaining"].(float64) != 75 {
		t.Fatalf("settle 25 of 40: %d %.300s", code, b)
	}
	if _, d, b := post(t, ts.URL+"/v1/check", `{"rule":"tokens","key":"`+key+`","hits":0}`); d["remaining"].(float64) != 75 {
		t.Fatalf("the identity's state after the settlement: %.300s, want 75 remaining", b)
	}
}

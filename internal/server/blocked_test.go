package server

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
)

// blockConfig has a rule that counts by a header (any length) and blocks.
const blockConfig = `
rules:
  - name: keys
    match: { path: /api/ }
    identity: [header:X-API-Key]
    limit: 2/m
    algorithm: fixed_window
    block: 10m
`

// TestBlockedLongIdentityShortForm: a 1 MB identity enters the penalty-box
// index, the hot keys and the lists in its 44-byte short form, and the
// admin calls given that form reach its state.
func TestBlockedLongIdentityShortForm(t *testing.T) {
	s, ts := newTestServer(t, WithConfig(mustParse(t, blockConfig)), WithAdminToken(token))
	long := strings.Repeat("A", 1<<20)
	short := keys.ShortIdentity(long)
	ctx := context.Background()
	for range 3 {
		if _, err := s.Policy().CheckKey(ctx, policy.KeyRequest{Rule: "keys", Key: long, N: 1}); err != nil {
			t.Fatal(err)
		}
	}
	resp, b := call(t, "GET", ts.URL+"/v1/blocked", "", bearer(token)...)
	if resp.StatusCode != 200 || len(b) > 4096 || !strings.Contains(string(b), `"identity":"`+short+`"`) {
		t.Fatalf("GET /v1/blocked: %d, %d bytes: %.300s", resp.StatusCode, len(b), b)
	}
	s.blocked.mu.Lock()
	for k := range s.blocked.m {
		if len(k.identity) > keys.MaxIdentityLen {
			t.Errorf("the index keeps an identity of %d bytes", len(k.identity))
		}
	}
	s.blocked.mu.Unlock()
	if _, b := call(t, "GET", ts.URL+"/v1/top?rule=keys", "", bearer(token)...); len(b) > 4096 || !strings.Contains(string(b), short) {
		t.Fatalf("GET /v1/top: %d bytes: %.300s", len(b), b)
	}
	q := "?rule=keys&key=" + url.QueryEscape(short)
	resp, b = call(t, "GET", ts.URL+"/v1/state"+q, "", bearer(token)...)
	if d := decode(t, b); resp.StatusCode != 200 || d["allowed"] != false {
		t.Fatalf("GET /v1/state by the short form: %d %s; want the blocked state", resp.StatusCode, b)
	}
	resp, b = call(t, "DELETE", ts.URL+"/v1/blocked"+q, "", bearer(token)...)
	if resp.StatusCode != 200 {
		t.Fatalf("DELETE /v1/blocked by the short form: %d %s", resp.StatusCode, b)
	}
	if _, b := call(t, "GET", ts.URL+"/v1/blocked", "", bearer(token)...); strings.Contains(string(b), short) {
		t.Fatalf("still listed after DELETE: %s", b)
	}
	if rr, err := s.Policy().CheckKey(ctx, policy.KeyRequest{Rule: "keys", Key: long, N: 1}); err != nil || !rr.Result.Allowed {
		t.Fatalf("the long identity after DELETE /v1/blocked: %+v %v; want its state reset", rr.Result, err)
	}
	// DELETE /v1/state by the short form resets it too.
	for range 3 {
		s.Policy().CheckKey(ctx, policy.KeyRequest{Rule: "keys", Key: long, N: 1})
	}
	if resp, b := call(t, "DELETE", ts.URL+"/v1/state"+q, "", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("DELETE /v1/state: %d %s", resp.StatusCode, b)
	}
	if rr, _ := s.Policy().CheckKey(ctx, policy.KeyRequest{Rule: "keys", Key: long, N: 1}); !rr.Result.Allowed {
		t.Fatalf("the long identity after DELETE /v1/state by its short form: %+v", rr.Result)
	}
}

// TestBlockedRedisIndexBounded: the fleet's index in Redis keeps at most
// rmax members, those released last, however many identities are blocked.
func TestBlockedRedisIndexBounded(t *testing.T) {
	r := redistest.Standalone(t)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	const bound, rounds, per = 150, 6, 100
	b := newBlockedIndex(rdb, "test:index:blocked", quietLogger(), time.Now)
	b.rmax = bound
	base := time.Now().Add(time.Hour)
	for round := range rounds {
		batch := make([]BlockedEntry, per)
		for i := range batch {
			n := round*per + i
			batch[i] = BlockedEntry{"r", "id-" + strconv.Itoa(n), base.Add(time.Duration(n) * time.Second).UnixMilli()}
		}
		if err := b.write(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		v, err := r.Do("ZCARD", "test:index:blocked")
		if err != nil {
			t.Fatal(err)
		}
		if n, want := v.(int64), int64(min((round+1)*per, bound)); n != want {
			t.Fatalf("round %d: the ZSET holds %d members, want %d (bound %d)", round, n, want, bound)
		}
	}
	// The survivors are those released last.
	v, err := r.Do("ZRANGE", "test:index:blocked", "0", "0")
	if err != nil {
		t.Fatal(err)
	}
	first := v.([]any)[0].(string)
	if want := "r\x00id-" + strconv.Itoa(rounds*per-bound); first != want {
		t.Fatalf("the soonest release kept is %q, want %q", first, want)
	}
}

package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// redisTime reads a server's TIME in µs.
func redisTime(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	a := v.([]any)
	sec, _ := strconv.ParseInt(a[0].(string), 10, 64)
	us, _ := strconv.ParseInt(a[1].(string), 10, 64)
	return sec*1_000_000 + us
}

// TestBatchStampIsRedisTime: a stamped batch (weir.StampAllStore) on a
// standalone Redis dates every admitted take by the one TIME its multi
// script read, with each request's estimate and remaining.
func TestBatchStampIsRedisTime(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "bstamp"})
	reqs := []weir.Request{
		{Key: "k", Limit: weir.PerMinute(weir.FixedWindow, 60), N: 1},
		{Key: "k", Limit: weir.PerMinute(weir.TokenBucket, 10), N: 4},
	}
	res := make([]weir.Result, 2)
	stamps := make([]weir.Stamp, 2)
	before := redisTime(t, srv)
	if err := takeAllStamped(s, context.Background(), reqs, res, stamps); err != nil {
		t.Fatal(err)
	}
	after := redisTime(t, srv)
	at := stamps[0].At
	if at < before || at > after || stamps[1].At != at {
		t.Fatalf("stamps %+v, want one time within Redis TIME %d..%d", stamps, before, after)
	}
	for i, want := range []int64{59, 6} {
		if st := stamps[i]; st.Estimate != reqs[i].N || st.Remaining != want || res[i].Remaining != want {
			t.Fatalf("request %d: %+v %+v, want estimate %d and %d remaining", i, st, res[i], reqs[i].N, want)
		}
	}
	lim := weir.NewLimiter(s)
	if r, err := lim.SettleStamped(context.Background(), "k", reqs[1].Limit, stamps[1], 1); err != nil || r.Remaining != 9 {
		t.Fatalf("an immediate settle of 1 of 4: %+v %v, want 9 remaining", r, err)
	}
}

// clusterStampedBatch: a stamped batch across cluster slots dates each
// slot's takes by the TIME of the script that took them; a batch that
// another slot sinks (and whose admitted slots are refunded) dates none.
func clusterStampedBatch(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "bstamp"})
	ctx := context.Background()
	wide := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour}
	narrow := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Hour}
	reqs := []weir.Request{{Key: "a", Limit: wide, N: 3}, {Key: "b", Limit: wide, N: 1}, {Key: "c", Limit: narrow, N: 2}}
	slots := map[uint16]bool{}
	for _, r := range reqs {
		slots[slot(tagOf(r.Key))] = true
	}
	if len(slots) != len(reqs) {
		t.Fatalf("the test keys share slots: %v", slots)
	}
	res := make([]weir.Result, len(reqs))
	stamps := make([]weir.Stamp, len(reqs))
	before := redisTime(t, c.Nodes[0])
	if err := takeAllStamped(s, ctx, reqs, res, stamps); err != nil {
		t.Fatal(err)
	}
	after := redisTime(t, c.Nodes[0]) // the nodes share this machine's clock
	for i, st := range stamps {
		if st.At < before || st.At > after || st.Estimate != reqs[i].N || st.Remaining != res[i].Remaining || !res[i].Allowed {
			t.Fatalf("request %d: %+v %+v, want a stamp within TIME %d..%d", i, st, res[i], before, after)
		}
	}
	// c is used up: the next batch is sunk by its slot, a and b are refunded.
	stamps = []weir.Stamp{{At: 1}, {At: 1}, {At: 1}}
	if err := takeAllStamped(s, ctx, reqs, res, stamps); err != nil {
		t.Fatal(err)
	}
	if res[2].Allowed || res[0].Granted != 0 || res[1].Granted != 0 {
		t.Fatalf("the sunk batch: %+v", res)
	}
	for i, st := range stamps {
		if st != (weir.Stamp{}) {
			t.Fatalf("request %d of a sunk batch is stamped %+v", i, st)
		}
	}
	if r, err := s.Take(ctx, "a", wide, 0); err != nil || r.Remaining != 97 {
		t.Fatalf("a after the refund: %+v %v, want 97 remaining", r, err)
	}
}

// takeAllStamped decides reqs through s.Do and sets their Stamps.
func takeAllStamped(s *Store, ctx context.Context, reqs []weir.Request, res []weir.Result, stamps []weir.Stamp) error {
	err := s.Do(ctx, reqs, res)
	for i := range reqs {
		stamps[i] = res[i].Stamp(reqs[i].N)
	}
	return err
}

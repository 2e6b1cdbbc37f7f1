package server

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/weir-dev/weir/storetest"
)

// TestSnapshotFallbackSince: while on_error decides, the snapshot names
// the fallback and since when it has decided, through a steady outage;
// ten quiet seconds later both are gone.
func TestSnapshotFallbackSince(t *testing.T) {
	clk := storetest.NewClock(storetest.Epoch)
	cfg := mustParse(t, "store: {on_error: deny}\nrules:\n  - {name: r, limit: 7/m}\n")
	_, ts := newTestServer(t, WithConfig(cfg), WithStore(downStore{}), withClock(clk.Now))
	store := func() SnapshotStore {
		t.Helper()
		_, b := call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "")
		var snap Snapshot
		if err := json.Unmarshal(b, &snap); err != nil {
			t.Fatal(err)
		}
		return snap.Store
	}
	if st := store(); st.Fallback != "" || st.FallbackSinceMS != 0 {
		t.Fatalf("before any decision: %+v", st)
	}
	start := clk.Now().UnixMilli()
	for range 20 { // a decision every 2 s for 40 s
		check(t, ts.URL, "r", "k", 1)
		clk.Advance(2 * time.Second)
	}
	if st := store(); st.Fallback != "deny" || st.FallbackSinceMS != start {
		t.Fatalf("during the outage: fallback %q since %d, want deny since %d", st.Fallback, st.FallbackSinceMS, start)
	}
	clk.Advance(fallbackRecent)
	if st := store(); st.Fallback != "" || st.FallbackSinceMS != 0 {
		t.Fatalf("after 10 quiet seconds: %+v", st)
	}
	check(t, ts.URL, "r", "k", 1)
	if st := store(); st.FallbackSinceMS != clk.Now().UnixMilli() {
		t.Fatalf("a new outage: since %d, want %d", st.FallbackSinceMS, clk.Now().UnixMilli())
	}
}

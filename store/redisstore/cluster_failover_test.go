package redisstore

import (
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestClusterFailover fails a Cluster primary over to its replica and back
// while 32 goroutines decide on keys of every node, through the node
// batches, single decisions and all-or-nothing batches alike. A coordinated
// failover loses no write, so the store must stay exact: never more than
// the limit admitted, and every key's state must hold exactly what was
// reported admitted. The demoted primary refuses the node batches it still
// gets (READONLY: nbatch declares no keys, so Redis does not redirect it);
// the store sends their decisions again to the new primary, and none may
// fail.
func TestClusterFailover(t *testing.T) {
	c := redistest.Cluster(t)
	replica := c.AddReplica(t, c.Nodes[0])
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "fo", Timeout: 20 * time.Second})
	var keys []string
	for i, n := range c.Nodes {
		keys = append(keys, keysOnNode(c, n, "fo"+string(rune('a'+i)), 4, -1)...)
	}
	l := startLoad(s, keys, 400, 32, true)
	promoted := replica
	for i := range 2 {
		l.waitMade(int64(400 * (i + 1)))
		if err := c.Failover(promoted); err != nil {
			l.halt()
			t.Fatalf("failover %d: %v", i, err)
		}
		promoted = c.Replicas[0] // the demoted primary, promoted back next
	}
	l.waitMade(l.made.Load() + 400)
	l.check(t, "2 failovers")
}

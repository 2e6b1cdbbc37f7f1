package redistest

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// AddReplica starts one more cluster node and makes it a replica of primary
// (one of c.Nodes). It returns once the replica has synced and every node
// lists it as primary's replica; it is appended to c.Replicas. The cluster's
// clients may be given its address or not: either way they find it in the
// cluster's topology.
func (c *ClusterGroup) AddReplica(t testing.TB, primary *Server) *Server {
	t.Helper()
	r := newServerAuth(t, "cluster replica", true, func(port int, dir string) ([]string, error) {
		return append(baseArgs(port, dir), c.sec.args(port)...), nil
	}, c.sec.client(), c.sec.Password)
	primaryID, err := primary.doString("CLUSTER", "MYID")
	if err != nil {
		t.Fatalf("redistest: AddReplica: %v", err)
	}
	_, port, _ := net.SplitHostPort(primary.Addr)
	if _, err := r.doString("CLUSTER", "MEET", "127.0.0.1", port); err != nil {
		t.Fatalf("redistest: AddReplica: %v", err)
	}
	all := append(slices.Clone(c.Nodes), r)
	// REPLICATE needs the replica to know the primary first (gossip).
	waitForGroup(t, all, func() error {
		_, err := r.doString("CLUSTER", "REPLICATE", primaryID)
		return err
	}, "the new node could not replicate its primary")
	rID, err := r.doString("CLUSTER", "MYID")
	if err != nil {
		t.Fatalf("redistest: AddReplica: %v", err)
	}
	waitForGroup(t, all, func() error {
		if err := linkUp(r); err != nil {
			return err
		}
		return c.roles(all, rID, "slave", primaryID)
	}, "the replica did not sync or the cluster did not learn of it")
	c.Replicas = append(c.Replicas, r)
	return r
}

// Failover promotes replica (from c.Replicas) with CLUSTER FAILOVER, the
// coordinated kind: its primary stops taking writes until the replica has
// every write, so none is lost. It returns once every running node lists
// the replica as a primary and its old primary as its replica, the old
// primary has synced from it, and the cluster is ok everywhere. The two
// swap places: the new primary takes the old one's index in c.Nodes and
// c.Addrs, and the old primary goes to c.Replicas, so that it can be
// promoted back.
func (c *ClusterGroup) Failover(replica *Server) error {
	ri := slices.Index(c.Replicas, replica)
	if ri < 0 {
		return fmt.Errorf("redistest: Failover: %s is not a replica of this cluster", replica.Addr)
	}
	rID, err := replica.doString("CLUSTER", "MYID")
	if err != nil {
		return fmt.Errorf("redistest: Failover: %w", err)
	}
	// The replica's primary, by CLUSTER NODES: "<id> ... slave <primary id> ...".
	nodes, err := replica.doString("CLUSTER", "NODES")
	if err != nil {
		return fmt.Errorf("redistest: Failover: %w", err)
	}
	var primaryID string
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == rID {
			primaryID = f[3]
		}
	}
	pi := -1
	for i, n := range c.Nodes {
		if id, err := n.doString("CLUSTER", "MYID"); err == nil && id == primaryID {
			pi = i
		}
	}
	if pi < 0 {
		return fmt.Errorf("redistest: Failover: the primary %q of %s is not one of the cluster's nodes", primaryID, replica.Addr)
	}
	if _, err := replica.doString("CLUSTER", "FAILOVER"); err != nil {
		return fmt.Errorf("redistest: Failover: %w", err)
	}
	old := c.Nodes[pi]
	all := append(slices.Clone(c.Nodes), c.Replicas...)
	asked := time.Now()
	err = waitFor(60*time.Second, func() error {
		if err := c.roles(all, rID, "master", ""); err != nil {
			// A manual failover that does not finish in Redis's 5 s
			// (a loaded machine: the primary must pause its clients and
			// the replica catch up) is dropped; ask again.
			if role, _ := replica.infoField("replication", "role"); role != "master" && time.Since(asked) > 6*time.Second {
				asked = time.Now()
				_, _ = replica.doString("CLUSTER", "FAILOVER")
			}
			return err
		}
		if err := c.roles(all, primaryID, "slave", rID); err != nil {
			return err
		}
		if err := linkUp(old); err != nil {
			return err
		}
		for _, n := range all {
			info, err := n.doString("CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if got := lineValue(info, "cluster_state"); got != "ok" {
				return fmt.Errorf("%s: cluster_state %q", n.Addr, got)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redistest: Failover: %w", err)
	}
	// New slices, not writes into the old ones: clients given c.Addrs
	// (or c.Nodes) may still be reading them.
	c.Nodes, c.Replicas, c.Addrs = slices.Clone(c.Nodes), slices.Clone(c.Replicas), slices.Clone(c.Addrs)
	c.Nodes[pi], c.Replicas[ri] = replica, old
	c.Addrs[pi] = replica.Addr
	return nil
}

// roles reports nil when every running node of nodes lists id with the
// flag role ("master" or "slave") and, if of is not empty, as of's replica.
func (c *ClusterGroup) roles(nodes []*Server, id, role, of string) error {
	for _, n := range nodes {
		if !n.running.Load() {
			continue
		}
		text, err := n.doString("CLUSTER", "NODES")
		if err != nil {
			return err
		}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || f[0] != id {
				continue
			}
			found = true
			if !slices.Contains(strings.Split(f[2], ","), role) || (of != "" && f[3] != of) {
				return fmt.Errorf("%s: node %s is %q (of %q), want %s of %q", n.Addr, id, f[2], f[3], role, of)
			}
		}
		if !found {
			return fmt.Errorf("%s does not know node %s yet", n.Addr, id)
		}
	}
	return nil
}

// linkUp reports nil when replica's link to its primary is up.
func linkUp(replica *Server) error {
	st, err := replica.infoField("replication", "master_link_status")
	if err != nil {
		return err
	}
	if st != "up" {
		return fmt.Errorf("%s: master_link_status %q", replica.Addr, st)
	}
	return nil
}

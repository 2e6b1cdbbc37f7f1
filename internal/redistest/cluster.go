package redistest

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ClusterGroup is a Redis Cluster of three primaries started by Cluster, and
// the replicas AddReplica adds.
type ClusterGroup struct {
	// Addrs are the client addresses of the nodes, in the order of Nodes.
	Addrs []string
	// Nodes are the cluster nodes. Initially Nodes[0] owns slots 0-5460,
	// Nodes[1] 5461-10922 and Nodes[2] 10923-16383.
	Nodes []*Server
	// Replicas are the replicas AddReplica started (after a Failover, the
	// demoted primary stands in its replica's place).
	Replicas []*Server

	sec ClusterSecurity // of every node, replicas included
}

// clusterSlotRanges is the initial slot assignment of the three nodes.
var clusterSlotRanges = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// Cluster starts a Redis Cluster of three primaries without replicas on free
// loopback ports (each client port p has its bus port p+10000 free too),
// assigns all 16384 slots and returns once every node reports
// cluster_state:ok and knows all three primaries. All nodes are killed when
// the test ends. Skip rules are those of Standalone.
func Cluster(t testing.TB) *ClusterGroup {
	t.Helper()
	return newCluster(t, ClusterSecurity{})
}

// ClusterSecurity is what ClusterSecure turns on.
type ClusterSecurity struct {
	// TLS, if not nil, makes every node speak TLS only, to clients and
	// to one another on the cluster bus (tls-cluster yes).
	TLS *TLS
	// Password, if set, is required of clients (requirepass) and used
	// between primaries and replicas (masterauth).
	Password string
}

// ClusterSecure is Cluster with TLS and/or a password, as sec says. The
// helper's own connections use sec.TLS.Client and the password.
func ClusterSecure(t testing.TB, sec ClusterSecurity) *ClusterGroup {
	t.Helper()
	return newCluster(t, sec)
}

func newCluster(t testing.TB, sec ClusterSecurity) *ClusterGroup {
	t.Helper()
	c := &ClusterGroup{sec: sec}
	for range 3 {
		n := newServerAuth(t, "cluster node", true, func(port int, dir string) ([]string, error) {
			return append(baseArgs(port, dir), sec.args(port)...), nil
		}, sec.client(), sec.Password)
		c.Nodes = append(c.Nodes, n)
		c.Addrs = append(c.Addrs, n.Addr)
	}
	for i, n := range c.Nodes {
		r := clusterSlotRanges[i]
		for _, args := range [][]string{
			{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(r[0]), strconv.Itoa(r[1])},
			{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)},
		} {
			if _, err := n.doString(args...); err != nil {
				t.Fatalf("redistest: cluster setup: %v", err)
			}
		}
	}
	for _, n := range c.Nodes[1:] {
		_, port, _ := net.SplitHostPort(n.Addr)
		if _, err := c.Nodes[0].doString("CLUSTER", "MEET", "127.0.0.1", port); err != nil {
			t.Fatalf("redistest: cluster setup: %v", err)
		}
	}
	waitForGroup(t, c.Nodes, c.healthy, "cluster did not become healthy")
	return c
}

// client is the TLS config of the helper's own connections, if any.
func (sec ClusterSecurity) client() *tls.Config {
	if sec.TLS == nil {
		return nil
	}
	return sec.TLS.Client
}

// args are a cluster node's redis-server arguments beyond baseArgs.
func (sec ClusterSecurity) args(port int) []string {
	a := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		"--cluster-port", strconv.Itoa(port + 10000),
	}
	if sec.TLS != nil {
		a = append(a, sec.TLS.args(port)...)
		a = append(a, "--tls-cluster", "yes")
	}
	if sec.Password != "" {
		a = append(a, "--requirepass", sec.Password, "--masterauth", sec.Password)
	}
	return a
}

// healthy reports nil when every node says cluster_state:ok with all slots
// assigned and lists all three nodes as connected primaries.
func (c *ClusterGroup) healthy() error {
	ports := map[string]bool{}
	for _, a := range c.Addrs {
		ports[a] = true
	}
	for _, n := range c.Nodes {
		info, err := n.doString("CLUSTER", "INFO")
		if err != nil {
			return err
		}
		for key, want := range map[string]string{
			"cluster_state":          "ok",
			"cluster_slots_assigned": "16384",
			"cluster_known_nodes":    strconv.Itoa(len(c.Nodes)),
		} {
			if got := lineValue(info, key); got != want {
				return fmt.Errorf("%s: %s is %q, want %q", n.Addr, key, got, want)
			}
		}
		nodes, err := n.doString("CLUSTER", "NODES")
		if err != nil {
			return err
		}
		seen := 0
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				return fmt.Errorf("%s: malformed CLUSTER NODES line %q", n.Addr, line)
			}
			addr, _, _ := strings.Cut(f[1], "@")
			flags := "," + f[2] + ","
			if !ports[addr] || !strings.Contains(flags, ",master,") || f[7] != "connected" ||
				strings.Contains(flags, ",fail,") || strings.Contains(flags, ",fail?,") || strings.Contains(flags, ",handshake,") || strings.Contains(flags, ",noaddr,") {
				return fmt.Errorf("%s: node not ready yet: %q", n.Addr, line)
			}
			seen++
		}
		if seen != len(c.Nodes) {
			return fmt.Errorf("%s: knows %d nodes, want %d", n.Addr, seen, len(c.Nodes))
		}
	}
	return nil
}

// NodeForSlot returns the node that currently owns slot according to
// CLUSTER SLOTS (asked of the first running node that answers), or nil if no
// node could be asked or the owner is not one of Nodes.
func (c *ClusterGroup) NodeForSlot(slot int) *Server {
	for _, n := range c.Nodes {
		v, err := n.Do("CLUSTER", "SLOTS")
		if err != nil {
			continue
		}
		ranges, _ := v.([]any)
		for _, r := range ranges {
			rr, _ := r.([]any)
			if len(rr) < 3 {
				continue
			}
			start, _ := rr[0].(int64)
			end, _ := rr[1].(int64)
			if int64(slot) < start || int64(slot) > end {
				continue
			}
			primary, _ := rr[2].([]any)
			if len(primary) < 2 {
				return nil
			}
			host, _ := primary[0].(string)
			port, _ := primary[1].(int64)
			addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
			for _, m := range c.Nodes {
				if m.Addr == addr {
					return m
				}
			}
			return nil
		}
		return nil
	}
	return nil
}

// MigrateSlot moves slot, with all its keys, from node from to node to, the
// way redis-cli --cluster reshard does: CLUSTER SETSLOT IMPORTING on to and
// MIGRATING on from, MIGRATE of the keys in batches of 100, then CLUSTER
// SETSLOT NODE on to, from and every other running node. Clients see
// ASK/MOVED redirections while it runs.
func (c *ClusterGroup) MigrateSlot(slot int, from, to *Server) error {
	if slot < 0 || slot > 16383 {
		return fmt.Errorf("redistest: MigrateSlot: slot %d out of range", slot)
	}
	if from == nil || to == nil || from == to {
		return errors.New("redistest: MigrateSlot: need two distinct nodes")
	}
	fromID, err := from.doString("CLUSTER", "MYID")
	if err != nil {
		return fmt.Errorf("redistest: MigrateSlot: %w", err)
	}
	toID, err := to.doString("CLUSTER", "MYID")
	if err != nil {
		return fmt.Errorf("redistest: MigrateSlot: %w", err)
	}
	s := strconv.Itoa(slot)
	if _, err := to.doString("CLUSTER", "SETSLOT", s, "IMPORTING", fromID); err != nil {
		return fmt.Errorf("redistest: MigrateSlot: %w", err)
	}
	if _, err := from.doString("CLUSTER", "SETSLOT", s, "MIGRATING", toID); err != nil {
		return fmt.Errorf("redistest: MigrateSlot: %w", err)
	}
	host, port, _ := net.SplitHostPort(to.Addr)
	for {
		v, err := from.Do("CLUSTER", "GETKEYSINSLOT", s, "100")
		if err != nil {
			return fmt.Errorf("redistest: MigrateSlot: GETKEYSINSLOT: %w", err)
		}
		keys, _ := v.([]any)
		if len(keys) == 0 {
			break
		}
		args := []string{"MIGRATE", host, port, "", "0", "10000", "REPLACE", "KEYS"}
		for _, k := range keys {
			ks, ok := k.(string)
			if !ok {
				return fmt.Errorf("redistest: MigrateSlot: unexpected GETKEYSINSLOT element %#v", k)
			}
			args = append(args, ks)
		}
		if _, err := from.Do(args...); err != nil {
			return fmt.Errorf("redistest: MigrateSlot: MIGRATE: %w", err)
		}
	}
	// Target first (it bumps its config epoch), then the source, then the rest.
	order := []*Server{to, from}
	for _, n := range c.Nodes {
		if n != to && n != from {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if !n.running.Load() && n != to && n != from {
			continue // a stopped node learns the new owner from gossip
		}
		if _, err := n.doString("CLUSTER", "SETSLOT", s, "NODE", toID); err != nil {
			return fmt.Errorf("redistest: MigrateSlot: %w", err)
		}
	}
	return c.settled(slot, toID)
}

// settled waits (up to 10 s) until every running node gives slot to owner
// and all of them agree on every node's config epoch. Moving a slot again
// before gossip has spread the epoch the new owner took can make the next
// owner take an epoch no higher than another node's claim, and the slot
// then flips back to an old owner: a test that moves a slot back and forth
// quickly would see its keys on two nodes.
func (c *ClusterGroup) settled(slot int, owner string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.agree(slot, owner)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: MigrateSlot: the cluster did not settle: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agree reports nil when every running node's CLUSTER NODES gives slot to
// owner (no migration marks) and the same config epoch for each node.
func (c *ClusterGroup) agree(slot int, owner string) error {
	var epochs string
	for _, n := range c.Nodes {
		if !n.running.Load() {
			continue
		}
		nodes, err := n.doString("CLUSTER", "NODES")
		if err != nil {
			return err
		}
		var ids []string
		holder := ""
		for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 {
				return fmt.Errorf("%s: malformed CLUSTER NODES line %q", n.Addr, line)
			}
			ids = append(ids, f[0]+"="+f[6])
			for _, r := range f[8:] {
				if strings.HasPrefix(r, "[") {
					return fmt.Errorf("%s: a slot is still migrating: %s", n.Addr, r)
				}
				lo, hi, found := strings.Cut(r, "-")
				if !found {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && a <= slot && slot <= b {
					holder = f[0]
				}
			}
		}
		if holder != owner {
			return fmt.Errorf("%s: slot %d is %q's, want %q's", n.Addr, slot, holder, owner)
		}
		sort.Strings(ids)
		e := strings.Join(ids, " ")
		if epochs == "" {
			epochs = e
		} else if e != epochs {
			return fmt.Errorf("%s: config epochs %s, another node has %s", n.Addr, e, epochs)
		}
	}
	return nil
}

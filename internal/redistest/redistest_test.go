package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestReadReply(t *testing.T) {
	in := "+OK\r\n" +
		"-ERR boom\r\n" +
		":-42\r\n" +
		"$5\r\nhe\r\no\r\n" +
		"$-1\r\n" +
		"*-1\r\n" +
		"*3\r\n:1\r\n*2\r\n$1\r\na\r\n$-1\r\n-WRONGTYPE x\r\n" +
		"$0\r\n\r\n"
	want := []struct {
		v   any
		err error
	}{
		{"OK", nil},
		{nil, Error("ERR boom")},
		{int64(-42), nil},
		{"he\r\no", nil},
		{nil, nil},
		{nil, nil},
		{[]any{int64(1), []any{"a", nil}, Error("WRONGTYPE x")}, nil},
		{"", nil},
	}
	r := bufio.NewReader(strings.NewReader(in))
	for i, w := range want {
		v, err := readReply(r)
		if !reflect.DeepEqual(v, w.v) || !reflect.DeepEqual(err, w.err) {
			t.Errorf("reply %d: got (%#v, %v), want (%#v, %v)", i, v, err, w.v, w.err)
		}
	}
	for _, bad := range []string{"?x\r\n", ":abc\r\n", "$3\r\nabcd\r\n", "+no-crlf\n"} {
		if _, err := readReply(bufio.NewReader(strings.NewReader(bad))); err == nil || errors.As(err, new(Error)) {
			t.Errorf("readReply(%q) = %v, want protocol error", bad, err)
		}
	}
}

func mustDo(t *testing.T, s *Server, args ...string) any {
	t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%s: %s: %v", s.Addr, strings.Join(args, " "), err)
	}
	return v
}

func TestStandalone(t *testing.T) {
	t.Parallel()
	s := Standalone(t)
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") || strings.HasSuffix(s.Addr, ":6379") {
		t.Fatalf("unexpected Addr %q", s.Addr)
	}
	if v := mustDo(t, s, "SET", "k", "v"); v != "OK" {
		t.Fatalf("SET = %#v", v)
	}
	if v := mustDo(t, s, "GET", "k"); v != "v" {
		t.Fatalf("GET = %#v", v)
	}
	if v := mustDo(t, s, "GET", "missing"); v != nil {
		t.Fatalf("GET missing = %#v", v)
	}
	if v := mustDo(t, s, "INCRBY", "n", "5"); v != int64(5) {
		t.Fatalf("INCRBY = %#v", v)
	}
	var rerr Error
	if _, err := s.Do("INCR", "k"); !errors.As(err, &rerr) || !strings.HasPrefix(string(rerr), "ERR") {
		t.Fatalf("INCR on string: err = %v, want ERR reply", err)
	}
	if v := mustDo(t, s, "PING"); v != "PONG" { // connection survives error replies
		t.Fatalf("PING = %#v", v)
	}

	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("Do after Kill succeeded")
	}
	if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		c.Close()
		t.Fatal("port still accepts connections after Kill")
	}
	s.Kill() // idempotent

	s.Start()
	if v := mustDo(t, s, "PING"); v != "PONG" {
		t.Fatalf("PING after Start = %#v", v)
	}
	if v := mustDo(t, s, "GET", "k"); v != nil {
		t.Fatalf("GET after restart = %#v, want nil (no persistence)", v)
	}
	s.Start() // no-op while running

	s.Stop()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("Do after Stop succeeded")
	}
	s.Stop() // idempotent
	s.Start()
	if v := mustDo(t, s, "SET", "k", "v2"); v != "OK" {
		t.Fatalf("SET after second Start = %#v", v)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := Cluster(t)
	if len(c.Nodes) != 3 || len(c.Addrs) != 3 {
		t.Fatalf("got %d nodes / %d addrs, want 3", len(c.Nodes), len(c.Addrs))
	}
	for i, n := range c.Nodes {
		if c.Addrs[i] != n.Addr {
			t.Fatalf("Addrs[%d] = %s, Nodes[%d].Addr = %s", i, c.Addrs[i], i, n.Addr)
		}
		info := mustDo(t, n, "CLUSTER", "INFO").(string)
		if lineValue(info, "cluster_state") != "ok" {
			t.Fatalf("%s: CLUSTER INFO:\n%s", n.Addr, info)
		}
	}

	keySlot := func(key string) int {
		t.Helper()
		v, ok := mustDo(t, c.Nodes[0], "CLUSTER", "KEYSLOT", key).(int64)
		if !ok {
			t.Fatalf("CLUSTER KEYSLOT %s: not an integer", key)
		}
		return int(v)
	}

	// Keys with different hash tags spread over all three nodes.
	owners := map[*Server]string{}
	for i := 0; len(owners) < 3 && i < 100; i++ {
		key := fmt.Sprintf("{tag%d}:k", i)
		n := c.NodeForSlot(keySlot(key))
		if n == nil {
			t.Fatalf("NodeForSlot(%d) = nil", keySlot(key))
		}
		if _, dup := owners[n]; !dup {
			owners[n] = key
		}
	}
	if len(owners) != 3 {
		t.Fatalf("keys landed on %d nodes, want 3", len(owners))
	}
	for n, key := range owners {
		mustDo(t, n, "SET", key, n.Addr)
		if v := mustDo(t, n, "GET", key); v != n.Addr {
			t.Fatalf("GET %s on %s = %#v", key, n.Addr, v)
		}
		for _, other := range c.Nodes {
			if other == n {
				continue
			}
			var rerr Error
			if _, err := other.Do("GET", key); !errors.As(err, &rerr) || !strings.HasPrefix(string(rerr), "MOVED ") {
				t.Fatalf("GET %s on non-owner %s: err = %v, want MOVED", key, other.Addr, err)
			}
		}
	}

	// MigrateSlot moves the slot together with its keys (more than one batch).
	key := "{migrate}:k"
	slot := keySlot(key)
	from := c.NodeForSlot(slot)
	var to *Server
	for _, n := range c.Nodes {
		if n != from {
			to = n
			break
		}
	}
	mustDo(t, from, "SET", key, "moved")
	for i := range 250 {
		mustDo(t, from, "SET", "{migrate}:"+strconv.Itoa(i), "x")
	}
	if err := c.MigrateSlot(slot, from, to); err != nil {
		t.Fatal(err)
	}
	if v := mustDo(t, to, "GET", key); v != "moved" {
		t.Fatalf("GET %s on target = %#v, want \"moved\"", key, v)
	}
	if v := mustDo(t, to, "CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); v != int64(251) {
		t.Fatalf("COUNTKEYSINSLOT on target = %#v, want 251", v)
	}
	var rerr Error
	if _, err := from.Do("GET", key); !errors.As(err, &rerr) || !strings.HasPrefix(string(rerr), "MOVED "+strconv.Itoa(slot)+" "+to.Addr) {
		t.Fatalf("GET on source after migration: err = %v, want MOVED to %s", err, to.Addr)
	}
	if got := c.NodeForSlot(slot); got != to {
		t.Fatalf("NodeForSlot after migration = %v, want %s", got, to.Addr)
	}
	for _, n := range c.Nodes {
		if v := mustDo(t, n, "CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); n != to && v != int64(0) {
			t.Fatalf("%s still has %v keys in slot %d", n.Addr, v, slot)
		}
		if info := mustDo(t, n, "CLUSTER", "INFO").(string); lineValue(info, "cluster_state") != "ok" {
			t.Fatalf("%s: cluster not ok after migration:\n%s", n.Addr, info)
		}
	}
	if err := c.MigrateSlot(slot, to, to); err == nil {
		t.Fatal("MigrateSlot to the same node succeeded")
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	g := Sentinel(t)
	if g.MasterName != "weirtest" || len(g.Sentinels) != 3 || len(g.SentinelAddrs) != 3 {
		t.Fatalf("unexpected group: %+v", g)
	}
	addr, err := g.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if addr != g.Primary.Addr {
		t.Fatalf("MasterAddr = %s, want primary %s", addr, g.Primary.Addr)
	}

	mustDo(t, g.Primary, "SET", "k", "v")
	if v := mustDo(t, g.Primary, "WAIT", "1", "5000"); v != int64(1) {
		t.Fatalf("WAIT = %#v, want 1 replica", v)
	}

	start := time.Now()
	if err := g.Failover(); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover took %v", time.Since(start).Round(time.Millisecond))
	addr, err = g.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if addr != g.Replica.Addr {
		t.Fatalf("MasterAddr after failover = %s, want former replica %s", addr, g.Replica.Addr)
	}
	if v := mustDo(t, g.Replica, "SET", "k2", "v2"); v != "OK" {
		t.Fatalf("SET on promoted replica = %#v", v)
	}
	if v := mustDo(t, g.Replica, "GET", "k"); v != "v" {
		t.Fatalf("GET k on promoted replica = %#v, want \"v\"", v)
	}
}

package redistest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sentinelMasterName is the master name the sentinels of Sentinel monitor.
const sentinelMasterName = "weirtest"

// SentinelGroup is a primary, one replica and three sentinels started by
// Sentinel.
type SentinelGroup struct {
	// MasterName is the monitored master name, "weirtest".
	MasterName string
	// SentinelAddrs are the addresses of the sentinels, in the order of
	// Sentinels.
	SentinelAddrs []string
	// Primary and Replica are the data nodes as started. The fields are not
	// swapped by Failover: after one failover Replica is the master.
	Primary, Replica *Server
	// Sentinels are the three sentinel processes.
	Sentinels []*Server
}

// Sentinel starts a primary, a replica of it (--replicaof) and three
// sentinels monitoring it as "weirtest" with quorum 2, down-after 1000ms and
// failover-timeout 5000ms. It returns once the replica's link is up and every
// sentinel sees the master, the healthy replica and the two other sentinels.
// Everything is killed when the test ends. Skip rules are those of
// Standalone.
func Sentinel(t testing.TB) *SentinelGroup {
	t.Helper()
	g := &SentinelGroup{MasterName: sentinelMasterName}
	g.Primary = newServer(t, "sentinel primary", false, func(port int, dir string) ([]string, error) {
		return baseArgs(port, dir), nil
	})
	_, primaryPort, _ := net.SplitHostPort(g.Primary.Addr)
	g.Replica = newServer(t, "sentinel replica", false, func(port int, dir string) ([]string, error) {
		return append(baseArgs(port, dir), "--replicaof", "127.0.0.1", primaryPort), nil
	})
	g.waitReplicaSynced(t, "replica")

	for range 3 {
		s := newServer(t, "sentinel", false, func(port int, dir string) ([]string, error) {
			conf := filepath.Join(dir, "sentinel.conf")
			text := strings.Join([]string{
				"port " + strconv.Itoa(port),
				"bind 127.0.0.1",
				"daemonize no",
				"dir " + strconv.Quote(dir),
				"logfile " + strconv.Quote(filepath.Join(dir, "redis.log")),
				"sentinel monitor " + g.MasterName + " 127.0.0.1 " + primaryPort + " 2",
				"sentinel down-after-milliseconds " + g.MasterName + " 1000",
				"sentinel failover-timeout " + g.MasterName + " 5000",
				"sentinel parallel-syncs " + g.MasterName + " 1",
			}, "\n") + "\n"
			if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
				return nil, err
			}
			return []string{conf, "--sentinel"}, nil
		})
		g.Sentinels = append(g.Sentinels, s)
		g.SentinelAddrs = append(g.SentinelAddrs, s.Addr)
	}

	waitForGroup(t, g.Sentinels, g.settled, "sentinels did not converge")
	return g
}

// settled reports nil when every sentinel sees the master as healthy, knows
// the two other sentinels and sees the replica as a healthy replica.
func (g *SentinelGroup) settled() error {
	for _, s := range g.Sentinels {
		v, err := s.Do("SENTINEL", "MASTER", g.MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
		m := flatMap(v)
		if m["flags"] != "master" || atoi(m["num-slaves"]) < 1 || atoi(m["num-other-sentinels"]) < 2 {
			return fmt.Errorf("sentinel %s: master not settled: flags=%q num-slaves=%q num-other-sentinels=%q",
				s.Addr, m["flags"], m["num-slaves"], m["num-other-sentinels"])
		}
		v, err = s.Do("SENTINEL", "REPLICAS", g.MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
		list, _ := v.([]any)
		ok := false
		for _, r := range list {
			rm := flatMap(r)
			if net.JoinHostPort(rm["ip"], rm["port"]) == g.Replica.Addr &&
				rm["flags"] == "slave" && rm["master-link-status"] == "ok" {
				ok = true
			}
		}
		if !ok {
			return fmt.Errorf("sentinel %s: replica %s not yet seen as healthy", s.Addr, g.Replica.Addr)
		}
	}
	return nil
}

// MasterAddr returns the current master address ("ip:port") as reported by
// SENTINEL GET-MASTER-ADDR-BY-NAME from the first running sentinel that
// answers.
func (g *SentinelGroup) MasterAddr() (string, error) {
	var last error = errors.New("redistest: no sentinel is running")
	for _, s := range g.Sentinels {
		addr, err := masterAddrFrom(s, g.MasterName)
		if err == nil {
			return addr, nil
		}
		last = err
	}
	return "", last
}

func masterAddrFrom(s *Server, name string) (string, error) {
	v, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
	if err != nil {
		return "", fmt.Errorf("redistest: sentinel %s: %w", s.Addr, err)
	}
	a, _ := v.([]any)
	if len(a) != 2 {
		return "", fmt.Errorf("redistest: sentinel %s: unexpected GET-MASTER-ADDR-BY-NAME reply %#v", s.Addr, v)
	}
	host, _ := a[0].(string)
	port, _ := a[1].(string)
	return net.JoinHostPort(host, port), nil
}

// Failover runs SENTINEL FAILOVER weirtest (retrying while a sentinel answers
// NOGOODSLAVE or INPROG) and waits up to 20s until every running sentinel
// reports the other data node (the former replica, on the first call) as
// master and that node itself reports role:master. The former master is
// turned into a replica by the sentinels asynchronously, some seconds later.
func (g *SentinelGroup) Failover() error {
	cur, err := g.MasterAddr()
	if err != nil {
		return err
	}
	var target *Server
	switch cur {
	case g.Primary.Addr:
		target = g.Replica
	case g.Replica.Addr:
		target = g.Primary
	default:
		return fmt.Errorf("redistest: Failover: sentinels report unknown master %s", cur)
	}

	const timeout = 20 * time.Second
	var issued time.Time // last time a sentinel accepted SENTINEL FAILOVER
	err = waitFor(timeout, func() error {
		done := g.promoted(target)
		if done == nil {
			return nil
		}
		// (Re)issue the failover unless one was accepted recently; a
		// failover that aborts ends after failover-timeout (5s).
		if issued.IsZero() || time.Since(issued) > 6*time.Second {
			var ferr error
			for _, s := range g.Sentinels {
				if !s.running.Load() {
					continue
				}
				if _, ferr = s.Do("SENTINEL", "FAILOVER", g.MasterName); ferr == nil {
					issued = time.Now()
					break
				}
			}
			if ferr != nil {
				return fmt.Errorf("SENTINEL FAILOVER: %w (state: %v)", ferr, done)
			}
		}
		return done
	})
	if err != nil {
		return fmt.Errorf("redistest: Failover to %s: %w", target.Addr, err)
	}
	return nil
}

// promoted reports nil when all running sentinels name target as master and
// target reports role:master.
func (g *SentinelGroup) promoted(target *Server) error {
	n := 0
	for _, s := range g.Sentinels {
		if !s.running.Load() {
			continue
		}
		n++
		addr, err := masterAddrFrom(s, g.MasterName)
		if err != nil {
			return err
		}
		if addr != target.Addr {
			return fmt.Errorf("sentinel %s still reports master %s", s.Addr, addr)
		}
	}
	if n == 0 {
		return errors.New("no sentinel is running")
	}
	role, err := target.infoField("replication", "role")
	if err != nil {
		return err
	}
	if role != "master" {
		return fmt.Errorf("%s reports role:%s", target.Addr, role)
	}
	return nil
}

// flatMap turns a flat [k1, v1, k2, v2, ...] array reply into a map.
func flatMap(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		m[k] = val
	}
	return m
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// waitReplicaSynced waits until g's replica reports its link to the
// primary up, failing t (with both servers' logs) if it never does.
func (g *SentinelGroup) waitReplicaSynced(t testing.TB, what string) {
	t.Helper()
	if err := waitFor(groupTimeout, func() error {
		st, err := g.Replica.infoField("replication", "master_link_status")
		if err == nil && st != "up" {
			err = fmt.Errorf("replica %s: master_link_status:%s", g.Replica.Addr, st)
		}
		return err
	}); err != nil {
		t.Fatalf("redistest: %s did not sync: %v\n%s%s", what, err, g.Primary.logTail(), g.Replica.logTail())
	}
}

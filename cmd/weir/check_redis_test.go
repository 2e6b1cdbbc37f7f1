package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestCheckRedisProcesses runs several `weir check --redis` processes at
// once against one key of one Redis: together they admit exactly the limit,
// because every decision is one atomic script in Redis.
func TestCheckRedisProcesses(t *testing.T) {
	srv := redistest.Standalone(t)
	bin := weirBinary(t)
	const procs, hits, limit = 4, 50, 60
	for _, algo := range []string{"sliding_log", "gcra", "concurrency"} {
		t.Run(algo, func(t *testing.T) {
			outs := make([]bytes.Buffer, procs)
			errs := make([]error, procs)
			var wg sync.WaitGroup
			for p := range procs {
				cmd := exec.Command(bin, "check", "--redis", "redis://"+srv.Addr+"/0", "--limit", fmt.Sprintf("%d/h", limit),
					"--algorithm", algo, "--key", "shared-"+algo, "--hits", fmt.Sprint(hits), "--parallel", "4", "--json", "--timeout", "5s")
				var stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &outs[p], &stderr
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := cmd.Run(); err != nil {
						errs[p] = fmt.Errorf("%v: %s", err, stderr.String())
					}
				}()
			}
			wg.Wait()
			allowed, lines := 0, 0
			for p := range procs {
				if errs[p] != nil {
					t.Fatalf("process %d: %v", p, errs[p])
				}
				lines += strings.Count(outs[p].String(), "\n")
				allowed += strings.Count(outs[p].String(), `"allowed":true`)
			}
			if lines != procs*hits {
				t.Fatalf("%d decisions printed, want %d", lines, procs*hits)
			}
			if allowed != limit {
				t.Fatalf("%d processes × %d hits admitted %d in total under %d/h, want exactly %d", procs, hits, allowed, limit, limit)
			}
		})
	}
}

func TestCheckRedisBadURL(t *testing.T) {
	_, errs, code := runCLI(t, "check", "--limit", "5/m", "--redis", "redis://host:notaport")
	if code != 2 || !strings.Contains(errs, `"redis://host:notaport"`) {
		t.Fatalf("exit %d, stderr %q; want 2 and the URL quoted", code, errs)
	}
}

func TestCheckRedisBadTimeout(t *testing.T) {
	_, errs, code := runCLI(t, "check", "--limit", "5/m", "--redis", "redis://127.0.0.1:1/0", "--timeout", "-1s")
	if code != 2 || !strings.Contains(errs, "--timeout -1s") {
		t.Fatalf("exit %d, stderr %q; want 2 and the timeout named", code, errs)
	}
}

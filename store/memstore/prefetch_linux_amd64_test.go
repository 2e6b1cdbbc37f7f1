//go:build !purego

package memstore

import (
	"os"
	"strings"
	"testing"
)

// TestPrefetchWMatchesCPUInfo: the CPUID bit memstore reads for PREFETCHW
// is the one Linux reports as 3dnowprefetch.
func TestPrefetchWMatchesCPUInfo(t *testing.T) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, flags, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "flags" {
			want := false
			for _, f := range strings.Fields(flags) {
				want = want || f == "3dnowprefetch"
			}
			if hasPrefetchW != want {
				t.Fatalf("hasPrefetchW = %v, /proc/cpuinfo's 3dnowprefetch: %v", hasPrefetchW, want)
			}
			return
		}
	}
	t.Skip("no flags in /proc/cpuinfo")
}

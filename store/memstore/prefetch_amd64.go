//go:build !purego

package memstore

// hasPrefetchW reports whether the CPU has PREFETCHW, which asks for a
// line to write (so that a line another core holds is not fetched to be
// read and then again to be written). Without it, prefetch uses
// PREFETCHT0.
//
//lint:ignore U1000 read by prefetch_amd64.s
var hasPrefetchW = cpuPrefetchW()

func cpuPrefetchW() bool

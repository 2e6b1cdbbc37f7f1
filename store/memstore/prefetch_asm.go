//go:build (amd64 || arm64) && !purego

package memstore

// prefetch asks the CPU to bring the cache line at addr in (PREFETCHT0 on
// amd64, PRFM PLDL1KEEP on arm64). It is a hint: it never faults, whatever
// addr is, and it does not wait for the line.
//
//go:noescape
func prefetch(addr uintptr)

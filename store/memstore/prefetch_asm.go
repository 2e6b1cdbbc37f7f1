//go:build (amd64 || arm64) && !purego

package memstore

// prefetch asks the CPU to bring the cache line at addr in, to be written
// (PREFETCHW where the CPU has it, PREFETCHT0 otherwise, on amd64; PRFM
// PSTL1KEEP on arm64). It is a hint: it never faults, whatever addr is,
// and it does not wait for the line.
//
//go:noescape
func prefetch(addr uintptr)

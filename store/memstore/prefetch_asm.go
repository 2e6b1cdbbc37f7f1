//go:build (amd64 || arm64) && !purego

package memstore

// prefetchShard asks the CPU to bring in, to be written, the lines of the
// shard at address shard that shardLines lists and the line at slot
// (PREFETCHW where the CPU has it, PREFETCHT0 otherwise, on amd64; PRFM
// PSTL1KEEP on arm64). It is a hint: it never faults, whatever the
// addresses are, and it does not wait for the lines. One call for the
// five lines: each call to an assembly function makes its caller spill
// the registers it keeps live.
//
//go:noescape
func prefetchShard(shard, slot uintptr)

//go:build !(amd64 || arm64) || purego

package memstore

// prefetchShard does nothing where memstore has no prefetch instruction.
func prefetchShard(shard, slot uintptr) {}

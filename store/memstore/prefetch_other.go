//go:build !(amd64 || arm64) || purego

package memstore

// prefetch does nothing where memstore has no prefetch instruction.
func prefetch(addr uintptr) {}

//go:build !linux

package denycache

import "testing"

// threadCPU reports nothing where RUSAGE_THREAD does not exist.
func threadCPU(*testing.B) func() { return func() {} }

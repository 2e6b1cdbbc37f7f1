//go:build linux

package denycache

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU pins the benchmark to its thread and returns a function that
// reports the thread's CPU time per op as "cpu-ns/op": unlike ns/op, it
// does not count the time other processes of a loaded machine held the
// core.
func threadCPU(b *testing.B) func() {
	runtime.LockOSThread()
	const rusageThread = 1 // RUSAGE_THREAD
	var r0 syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &r0); err != nil {
		b.Fatal(err)
	}
	return func() {
		var r1 syscall.Rusage
		err := syscall.Getrusage(rusageThread, &r1)
		runtime.UnlockOSThread()
		if err != nil {
			b.Fatal(err)
		}
		cpu := time.Duration(r1.Utime.Nano()-r0.Utime.Nano()) + time.Duration(r1.Stime.Nano()-r0.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

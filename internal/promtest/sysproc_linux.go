//go:build linux

package promtest

import "syscall"

// sysProcAttr makes the kernel SIGKILL Prometheus if the test binary dies
// (strictly: if the OS thread that started it exits; the Go runtime keeps
// threads alive unless a goroutine exits while locked to one).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

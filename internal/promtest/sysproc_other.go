//go:build !linux

package promtest

import "syscall"

// sysProcAttr returns nil: parent-death signals are Linux-only, so on other
// systems only t.Cleanup stops Prometheus.
func sysProcAttr() *syscall.SysProcAttr { return nil }

//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: parent-death signals are Linux-only, so on other
// systems only t.Cleanup stops the servers.
func sysProcAttr() *syscall.SysProcAttr { return nil }

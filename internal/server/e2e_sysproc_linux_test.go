package server

import "syscall"

// procAttr makes a child process die with the test binary.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

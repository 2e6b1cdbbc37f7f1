//go:build !linux

package server

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }

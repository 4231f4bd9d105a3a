//go:build !linux

package bench

import (
	"errors"
	"syscall"
)

// errNoSplit is what a CPU split (Setup.EtcdCPUs) returns where it is not
// built: pinning uses Linux's sched_setaffinity.
var errNoSplit = errors.New("bench: --etcd-cpus needs Linux (sched_setaffinity)")

// pinProcess is Linux only (affinity_linux.go).
func pinProcess(cpus []int) error { return errNoSplit }

// splitCPUs is Linux only (affinity_linux.go).
func splitCPUs(etcd []int) ([]int, error) { return nil, errNoSplit }

// childProcAttr sets nothing off Linux.
func childProcAttr() *syscall.SysProcAttr { return nil }

//go:build linux

package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// pinProcess restricts every thread of this process to cpus (Linux
// sched_setaffinity, thread by thread from /proc/self/task; a thread made
// later inherits the mask of the thread that makes it, so the threads are
// listed again until a pass finds none it has not pinned) and lowers
// GOMAXPROCS to len(cpus) when it is above (Go would otherwise run more
// threads than the CPUs it may use; a lower GOMAXPROCS set by the user
// stays). It returns an error naming the first thread that could not be
// pinned.
func pinProcess(cpus []int) error {
	if len(cpus) == 0 {
		return fmt.Errorf("bench: pinning to no CPU")
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	pinned := map[int]bool{}
	for pass := 0; ; pass++ {
		if pass == 100 {
			return fmt.Errorf("bench: threads kept appearing while pinning to CPUs %v", cpus)
		}
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("bench: listing threads to pin: %w", err)
		}
		fresh := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || pinned[tid] {
				continue
			}
			fresh++
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("bench: pinning thread %d to CPUs %v: %w", tid, cpus, err)
			}
			pinned[tid] = true
		}
		if fresh == 0 {
			break
		}
	}
	if runtime.GOMAXPROCS(0) > len(cpus) {
		runtime.GOMAXPROCS(len(cpus))
	}
	return nil
}

// splitCPUs checks etcd, the CPUs asked for etcd, against this process's
// affinity mask and returns the rest of the mask, for everything else. It
// returns an error when a CPU is outside the mask, is named twice, or
// leaves nothing for the rest.
func splitCPUs(etcd []int) ([]int, error) {
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		return nil, fmt.Errorf("bench: reading the CPU mask: %w", err)
	}
	seen := map[int]bool{}
	for _, c := range etcd {
		if c < 0 || c >= len(mask)*64 || !mask.IsSet(c) {
			return nil, fmt.Errorf("bench: etcd CPU %d is not one this process may run on", c)
		}
		if seen[c] {
			return nil, fmt.Errorf("bench: etcd CPU %d named twice", c)
		}
		seen[c] = true
	}
	var rest []int
	for _, c := range cpusOf(&mask) {
		if !seen[c] {
			rest = append(rest, c)
		}
	}
	if len(rest) == 0 {
		return nil, fmt.Errorf("bench: etcd CPUs %v leave no CPU for the broker and the ingesters", etcd)
	}
	return rest, nil
}

// cpusOf lists the CPUs set in mask, in order.
func cpusOf(mask *unix.CPUSet) []int {
	var out []int
	for c := range len(mask) * 64 {
		if mask.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

// childProcAttr puts an etcd child in a process group of its own, so a
// terminal's Ctrl-C reaches the benchmark alone, which then stops the
// child in order (its stdin closing) instead of losing etcd mid-run.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

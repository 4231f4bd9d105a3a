package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// The CPU split (Setup.EtcdCPUs): a write-path benchmark on one machine
// shares its cores between etcd and what feeds it (broker, ingesters,
// reference writers), so a ratio against raw etcd also measures how much
// CPU the feeding side takes from etcd. Deployed, etcd members run on
// machines of their own (DESIGN "Performance goals"). With a split, etcd
// runs in a child process pinned to EtcdCPUs and this process is pinned to
// the other CPUs, in the reference runs and the timed ones alike.

// pinProcess restricts every thread of this process to cpus (Linux
// sched_setaffinity, thread by thread from /proc/self/task; threads made
// later inherit the mask of the thread that makes them) and sets
// GOMAXPROCS to len(cpus). It returns an error naming the first thread
// that could not be pinned.
func pinProcess(cpus []int) error {
	if len(cpus) == 0 {
		return fmt.Errorf("bench: pinning to no CPU")
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("bench: listing threads to pin: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("bench: pinning thread %d to CPUs %v: %w", tid, cpus, err)
		}
	}
	runtime.GOMAXPROCS(len(cpus))
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
	for c := range len(mask) * 64 {
		if mask.IsSet(c) && !seen[c] {
			rest = append(rest, c)
		}
	}
	if len(rest) == 0 {
		return nil, fmt.Errorf("bench: etcd CPUs %v leave no CPU for the broker and the ingesters", etcd)
	}
	return rest, nil
}

// PinOutsideEtcd pins this process to the CPUs of its mask that s leaves
// outside etcd (Setup.EtcdCPUs), so that the embedded etcd child processes
// and everything else never share a core; with no split it does nothing.
// Call it once, before a write-path benchmark starts anything. It returns
// the CPUs pinned to, or an error from splitCPUs or pinProcess.
func PinOutsideEtcd(s Setup) ([]int, error) {
	if len(s.EtcdCPUs) == 0 {
		return nil, nil
	}
	rest, err := splitCPUs(s.EtcdCPUs)
	if err != nil {
		return nil, err
	}
	return rest, pinProcess(rest)
}

// cpuLabel is the etcd_cpus label of a split: the CPU numbers joined by
// commas, or "shared" without one.
func cpuLabel(cpus []int) string {
	if len(cpus) == 0 {
		return "shared"
	}
	s := slices.Clone(cpus)
	slices.Sort(s)
	out := ""
	for i, c := range s {
		if i > 0 {
			out += ","
		}
		out += strconv.Itoa(c)
	}
	return out
}

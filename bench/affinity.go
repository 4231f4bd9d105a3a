package bench

import (
	"slices"
	"strconv"
)

// The CPU split (Setup.EtcdCPUs): a write-path benchmark on one machine
// shares its cores between etcd and what feeds it (broker, ingesters,
// reference writers), so a ratio against raw etcd also measures how much
// CPU the feeding side takes from etcd. Deployed, etcd members run on
// machines of their own (DESIGN "Performance goals"). With a split, etcd
// runs in a child process pinned to EtcdCPUs and this process is pinned to
// the other CPUs, in the reference runs and the timed ones alike.

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

package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/kvindex/kvindex/internal/logging"
)

// maskCPUs is this process's CPU mask as a list.
func maskCPUs(t *testing.T) []int {
	t.Helper()
	var mask unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mask); err != nil {
		t.Fatalf("SchedGetaffinity: %v", err)
	}
	return cpusOf(&mask)
}

func TestSplitCPUs(t *testing.T) {
	cpus := maskCPUs(t)
	if len(cpus) < 2 {
		t.Skipf("a split needs two CPUs; this process may use %v", cpus)
	}
	rest, err := splitCPUs(cpus[:1])
	if err != nil {
		t.Fatalf("splitCPUs(%v): %v", cpus[:1], err)
	}
	if diff := cmp.Diff(cpus[1:], rest); diff != "" {
		t.Errorf("splitCPUs(%v) rest (-want +got):\n%s", cpus[:1], diff)
	}
	for _, tc := range []struct {
		name string
		etcd []int
		want string
	}{
		{"every CPU", cpus, "leave no CPU"},
		{"twice", []int{cpus[0], cpus[0]}, "named twice"},
		{"negative", []int{-1}, "not one this process may run on"},
		{"past the mask", []int{1 << 20}, "not one this process may run on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := splitCPUs(tc.etcd)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("splitCPUs(%v) = %v, want an error containing %q", tc.etcd, err, tc.want)
			}
		})
	}
}

func TestCPULabel(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		want string
	}{{nil, "shared"}, {[]int{0}, "0"}, {[]int{3, 1}, "1,3"}} {
		if got := cpuLabel(tc.cpus); got != tc.want {
			t.Errorf("cpuLabel(%v) = %q, want %q", tc.cpus, got, tc.want)
		}
	}
}

// TestEtcdChild starts an etcd child pinned to one CPU, writes and reads
// through it, checks the child's CPU mask as the kernel reports it, and
// that close stops the child and removes its data.
func TestEtcdChild(t *testing.T) {
	cpus := maskCPUs(t)
	if len(cpus) < 2 {
		t.Skipf("a split needs two CPUs; this process may use %v", cpus)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := startEtcd(ctx, logging.Discard(), etcdOptions{noFsync: true, cpus: cpus[len(cpus)-1:]})
	if err != nil {
		t.Fatalf("startEtcd: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			n.close()
		}
	}()
	if n.child == nil || n.srv != nil {
		t.Fatalf("startEtcd with cpus ran etcd in this process")
	}
	if _, err := n.cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put: %v", err)
	}
	got, err := n.cli.Get(ctx, "k")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("get = %v, %v; want k=v", got, err)
	}
	// Every thread of the child, not only its first.
	pid := n.child.cmd.Process.Pid
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil || len(tasks) < 2 {
		t.Fatalf("listing the child's threads: %d, %v", len(tasks), err)
	}
	want := "Cpus_allowed_list:\t" + strconv.Itoa(cpus[len(cpus)-1]) + "\n"
	for _, task := range tasks {
		status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		if !strings.Contains(string(status), want) {
			t.Errorf("child %d thread %s's status lacks %q:\n%s", pid, task.Name(), want, status)
		}
	}
	n.close()
	closed = true
	if st := n.child.cmd.ProcessState; st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Errorf("child %d after close: state %v, want exited with status 0", pid, st)
	}
	if _, err := os.Stat(n.dir); !os.IsNotExist(err) {
		t.Errorf("the child's data directory %s is still there (%v)", n.dir, err)
	}
}

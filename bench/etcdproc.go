package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/logging"
)

// envEtcdNode, set in a process's environment, makes EtcdNodeMain run
// that process as an etcd child (etcdNodeSpec, as JSON).
const envEtcdNode = "KVINDEX_BENCH_ETCD_NODE"

// etcdNodeSpec is what a child etcd runs with.
type etcdNodeSpec struct {
	// Dir is etcd's data directory, removed when the child exits.
	Dir string `json:"dir"`
	// NoFsync and Quota are etcdOptions' noFsync and quota.
	NoFsync bool  `json:"no_fsync,omitempty"`
	Quota   int64 `json:"quota,omitempty"`
	// CPUs are the CPUs the child pins itself to.
	CPUs []int `json:"cpus"`
}

// etcdNodeReady is the child's line on stdout once etcd serves; the
// parent skips any other line before it.
type etcdNodeReady struct {
	Ready     bool     `json:"kvindex_bench_etcd_ready"`
	Endpoints []string `json:"endpoints"`
}

// childStartTimeout bounds the wait for a child etcd's ready line.
const childStartTimeout = 30 * time.Second

// EtcdNodeMain runs this process as a benchmark's etcd child when the
// environment asks for one (Setup.EtcdCPUs starts them): it pins itself
// to its CPUs, starts an embedded etcd on a free loopback port, prints its
// client endpoints as one JSON line on stdout, and serves until its stdin
// closes (the parent closed it or exited) or it gets SIGTERM or SIGINT.
// ok is false, and nothing is done, when the environment does not ask;
// otherwise code is the exit status (0, or 1 after an error on stderr).
// Any binary that runs benchmarks with a split calls it first in main (or
// TestMain).
func EtcdNodeMain() (code int, ok bool) {
	raw, ok := os.LookupEnv(envEtcdNode)
	if !ok {
		return 0, false
	}
	if err := runEtcdNode(raw, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kvindex-bench etcd child:", err)
		return 1, true
	}
	return 0, true
}

// runEtcdNode is EtcdNodeMain's work: raw is the etcdNodeSpec as JSON;
// the ready line goes to stdout, and the child serves until stdin ends or
// a stop signal comes. It returns the first error of parsing, pinning,
// starting etcd or writing the ready line.
func runEtcdNode(raw string, stdin io.Reader, stdout io.Writer) error {
	var spec etcdNodeSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("%s: %w", envEtcdNode, err)
	}
	if spec.Dir == "" {
		return fmt.Errorf("%s: no data directory", envEtcdNode)
	}
	// The parent removes it too; this covers a parent killed outright.
	defer os.RemoveAll(spec.Dir)
	if err := pinProcess(spec.CPUs); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	srv, err := etcdembed.Start(ctx, embedConfig(spec.Dir, spec.NoFsync, spec.Quota, logging.Discard()))
	if err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	defer srv.Close()
	line, err := json.Marshal(etcdNodeReady{Ready: true, Endpoints: srv.Endpoints()})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%s\n", line); err != nil {
		return fmt.Errorf("telling the parent: %w", err)
	}
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stdin)
		close(closed)
	}()
	select {
	case <-closed:
	case <-ctx.Done():
	}
	return nil
}

// etcdChild is a running etcd child process.
type etcdChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// startEtcdChild starts this executable as an etcd child (EtcdNodeMain)
// with data in dir, pinned to opts.cpus, and returns it with the client
// endpoints it printed. It fails when the child exits or prints nothing
// valid within childStartTimeout.
func startEtcdChild(ctx context.Context, log *slog.Logger, dir string, opts etcdOptions) (*etcdChild, []string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: finding this executable for the etcd child: %w", err)
	}
	spec, err := json.Marshal(etcdNodeSpec{Dir: dir, NoFsync: opts.noFsync, Quota: opts.quota, CPUs: opts.cpus})
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envEtcdNode+"="+string(spec))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: etcd child: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("bench: etcd child: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bench: starting the etcd child: %w", err)
	}
	c := &etcdChild{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	ready := make(chan etcdNodeReady, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r etcdNodeReady
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Ready {
				ready <- r
				break
			}
		}
		io.Copy(io.Discard, stdout)
		c.done <- cmd.Wait()
	}()
	t := time.NewTimer(childStartTimeout)
	defer t.Stop()
	select {
	case r := <-ready:
		if len(r.Endpoints) == 0 {
			c.stop()
			return nil, nil, errors.New("bench: the etcd child reported no endpoint")
		}
		log.Debug("etcd child ready", "pid", cmd.Process.Pid, "endpoints", r.Endpoints, "cpus", opts.cpus)
		return c, r.Endpoints, nil
	case err := <-c.done:
		c.done <- err
		return nil, nil, fmt.Errorf("bench: the etcd child exited before serving: %v", err)
	case <-t.C:
		c.stop()
		return nil, nil, fmt.Errorf("bench: the etcd child printed no endpoint within %v", childStartTimeout)
	case <-ctx.Done():
		c.stop()
		return nil, nil, ctx.Err()
	}
}

// stop closes the child's stdin (it stops etcd and exits) and waits for
// it, killing it after 10 s.
func (c *etcdChild) stop() {
	c.stdin.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.cmd.Process.Kill()
		<-c.done
	}
}

package standalonecmd

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
)

// freePorts are the flags that put every listener of a test's stack on a
// free loopback port.
var freePorts = []string{"--etcd-listen", "127.0.0.1:0", "--kafka-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}

// TestInterruptedWhileStarting: Ctrl-C before the stack is up stops what
// started and is no failure: nil (exit 0), "stopped", and nothing logged.
func TestInterruptedWhileStarting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cmd := NewCommand()
	cmd.SetArgs(append([]string{"--data-dir", t.TempDir() + "/data"}, freePorts...))
	var out, errs testutil.SyncBuffer
	cmd.SetOut(&out)
	cmd.SetErr(&errs)
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("standalone interrupted while starting = %v, want nil\n%s", err, errs.String())
	}
	if !strings.HasSuffix(out.String(), "stopped\n") || errs.String() != "" {
		t.Fatalf("standalone interrupted while starting printed\n%s\nand logged\n%s\nwant \"stopped\" and no log", out.String(), errs.String())
	}
}

// TestDataDirInUse: a second standalone on a data dir the first holds
// fails at once with an error naming --data-dir, instead of waiting on
// etcd's database lock and ignoring Ctrl-C.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir() + "/data"
	first := NewCommand()
	first.SetArgs(append([]string{"--data-dir", dir}, freePorts...))
	var out testutil.SyncBuffer
	first.SetOut(&out)
	first.SetErr(&out)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("first standalone: %v\n%s", err, out.String())
		}
	}()
	out.WaitMatch(t, regexp.MustCompile(`(?m)^ready`), time.Minute)

	second := NewCommand()
	second.SetArgs(append([]string{"--data-dir", dir}, freePorts...))
	var out2 testutil.SyncBuffer
	second.SetOut(&out2)
	second.SetErr(&out2)
	ctx2, cancel2 := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel2()
	err := second.ExecuteContext(ctx2)
	if err == nil || !strings.Contains(err.Error(), "data dir in use") || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("second standalone on the same data dir = %v, want an error naming --data-dir", err)
	}
}

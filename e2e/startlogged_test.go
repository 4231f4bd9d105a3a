package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
)

// startLogged starts cmd, a kvindex role run with --log-format json,
// copies its stderr into the returned buffer, and returns the first log
// line whose msg is startMsg (the role's start line, which names the
// addresses it bound). The process is killed at cleanup, and its stderr
// is logged if the test failed. It fails the test if the line does not
// come before ctx ends.
func startLogged(t *testing.T, ctx context.Context, cmd *exec.Cmd, startMsg string) (map[string]any, *syncBuffer) {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logs := new(syncBuffer)
	started := make(chan map[string]any, 1)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == startMsg {
				select {
				case started <- line:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-copied
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("stderr of the process that logs %q:\n%s", startMsg, logs)
		}
	})
	select {
	case line := <-started:
		return line, logs
	case <-ctx.Done():
		t.Fatalf("no %q line:\n%s", startMsg, logs)
		return nil, nil
	}
}

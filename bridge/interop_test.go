package bridge_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/contract"
)

// pyPublisher is testdata/zmq_publisher.py: a vLLM-like publisher on real
// libzmq (pyzmq), driven over stdin.
type pyPublisher struct {
	t              *testing.T
	out            *bufio.Scanner
	pub, replay    string
	payloads       [][]byte
	cmd            *exec.Cmd
	stdinW, stdout *os.File
}

// startPyPublisher runs the publisher with the Python interpreter named by
// $KVINDEX_PYTHON (default python3), or skips the test when that Python
// has no pyzmq.
func startPyPublisher(t *testing.T, ctx context.Context) *pyPublisher {
	t.Helper()
	py := os.Getenv("KVINDEX_PYTHON")
	if py == "" {
		py = "python3"
	}
	if err := exec.CommandContext(ctx, py, "-c", "import zmq").Run(); err != nil {
		t.Skipf("%s has no pyzmq (install python3-zmq, or set KVINDEX_PYTHON to a Python that has it): %v", py, err)
	}
	cmd := exec.CommandContext(ctx, py, "testdata/zmq_publisher.py")
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	p := &pyPublisher{t: t, out: bufio.NewScanner(outR), cmd: cmd, stdinW: inW, stdout: outR}
	t.Cleanup(func() { p.quit() })
	line := p.line()
	if _, err := fmt.Sscanf(line, "pub %s replay %s", &p.pub, &p.replay); err != nil {
		t.Fatalf("publisher said %q: %v", line, err)
	}
	return p
}

func (p *pyPublisher) line() string {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("publisher stopped: %v", p.out.Err())
	}
	return p.out.Text()
}

// send publishes payload (or only buffers it, drop) and returns its record.
func (p *pyPublisher) send(cmd string, payload []byte) rec {
	p.t.Helper()
	if _, err := fmt.Fprintf(p.stdinW, "%s %s\n", cmd, hex.EncodeToString(payload)); err != nil {
		p.t.Fatal(err)
	}
	want := fmt.Sprintf("seq %d", len(p.payloads))
	if got := p.line(); got != want {
		p.t.Fatalf("publisher said %q, want %q", got, want)
	}
	p.payloads = append(p.payloads, payload)
	return bridgetest.BatchRecord(pod, model, 0, uint64(len(p.payloads)-1), payload)
}

func (p *pyPublisher) quit() {
	if p.stdinW == nil {
		return
	}
	fmt.Fprintln(p.stdinW, "quit")
	p.stdinW.Close()
	p.cmd.Wait()
	p.stdout.Close()
	p.stdinW = nil
}

// TestInteropRealZMQ runs the bridge against real libzmq sockets (PUB and
// ROUTER, through pyzmq), the way vLLM's publisher uses them: catch-up
// replay at start, live delivery, a healed gap, and a goodbye when the
// publisher exits. Skipped where no Python with pyzmq is installed.
func TestInteropRealZMQ(t *testing.T) {
	e := newEnv(t, nil)
	p := startPyPublisher(t, e.ctx)
	w := e.workload
	var want []rec
	want = append(want, p.send("pub", w.Next().MustEncode())) // before any subscriber
	cfg := e.config(func(c *bridge.Config) {
		c.Endpoint, c.ReplayEndpoint = p.pub, p.replay
		c.GracePeriod = 2 * time.Second
	})
	r := e.start(cfg, false)
	if err := bridgetest.WaitReady(e.ctx, r.B); err != nil {
		t.Fatal(err)
	}
	check(t, "caught up by replay", want, e.read(1))
	// libzmq does not say when a subscription is active: publish until one
	// batch arrives live; the ones before it are healed from the replay.
	for metric(t, cfg, "kvindex_bridge_batches_received_total", "source", "live") == 0 {
		want = append(want, p.send("pub", w.Next().MustEncode()))
		if err := e.ctx.Err(); err != nil {
			t.Fatal("no batch ever arrived live")
		}
		time.Sleep(10 * time.Millisecond)
	}
	want = append(want, p.send("drop", w.Next().MustEncode()))
	want = append(want, p.send("drop", w.Next().MustEncode()))
	want = append(want, p.send("pub", w.Next().MustEncode()))
	check(t, "records", want[1:], e.read(len(want)-1))
	if n := metric(t, cfg, "kvindex_bridge_gaps_total"); n < 1 {
		t.Errorf("gaps = %v, want at least the forced one", n)
	}
	p.quit()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	check(t, "at shutdown", []rec{control(contract.KindGoodbye)}, e.readAll())
	if n := metric(t, cfg, "kvindex_bridge_resyncs_total"); n != 0 {
		t.Errorf("resyncs = %v, want 0", n)
	}
}

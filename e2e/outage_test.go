package e2e

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/stack"
)

// The outage test's windows, short so that twice the liveness window is
// a few seconds of real time (the property under test is time passing).
const (
	outageWindow    = 3 * time.Second // --liveness-window
	outageHeartbeat = 250 * time.Millisecond
)

const outageModel = "outage/model"

// outageFleet is an engine with its bridge (the live pod, heartbeating
// all along) and a pod that dies together with the fleet ("dead": one
// batch record just before the outage, never another).
type outageFleet struct {
	engine *enginesim.Engine
	bridge *bridgetest.Running
	live   keyspace.Endpoint
	dead   keyspace.Endpoint
	blocks uint64 // the live pod's GPU blocks before the outage
}

func startOutageFleet(t *testing.T, ctx context.Context, brokers []string) *outageFleet {
	t.Helper()
	eng, err := enginesim.New(enginesim.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	f := &outageFleet{engine: eng,
		live: keyspace.Endpoint{Model: outageModel, Pod: "default/vllm-live"},
		dead: keyspace.Endpoint{Model: outageModel, Pod: "default/vllm-dead"}}
	cfg := bridgeConfig(eng, brokers, f.live)
	cfg.HeartbeatInterval = outageHeartbeat
	f.bridge = startBridge(t, ctx, cfg, eng, 1, true)
	w := enginesim.NewWorkload(1, enginesim.WorkloadConfig{Capacity: 1 << 20}) // no evictions
	for range 3 {
		if _, err := eng.Publish(ctx, w.Next().MustEncode()); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// produceDead produces the dead pod's one batch record (4 GPU blocks).
func (f *outageFleet) produceDead(t *testing.T, ctx context.Context, brokers []string) {
	t.Helper()
	v, err := events.Encode(events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []events.Event{
		{Type: events.BlockStored, BlockHashes: []uint64{0xdead1, 0xdead2, 0xdead3, 0xdead4}, Medium: "GPU", BlockSize: 16},
	}}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	prod := ingesttest.NewProducer(t, brokers)
	ingesttest.Produce(t, ctx, prod, topic, []refmodel.Record{{Key: f.dead.Pod, Value: v, Time: time.Now(),
		Headers: map[string]string{contract.HeaderModel: outageModel, contract.HeaderDPRank: "0"}}})
}

// gpuBlocks lists the model's endpoints: pod → GPU blocks.
func gpuBlocks(ctx context.Context, c *client.Client) (map[string]uint64, error) {
	l, err := c.ListEndpoints(ctx, outageModel)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, e := range l.Endpoints {
		out[e.Endpoint.Pod] = e.GPUBlocks
	}
	return out, nil
}

// waitIndexed waits until both pods are indexed (the live one with all
// three batches) and notes the live pod's blocks.
func (f *outageFleet) waitIndexed(t *testing.T, ctx context.Context, c *client.Client, liveBlocks uint64) {
	t.Helper()
	for {
		got, err := gpuBlocks(ctx, c)
		if err == nil && got[f.dead.Pod] == 4 && got[f.live.Pod] >= liveBlocks && got[f.live.Pod] > 0 {
			f.blocks = got[f.live.Pod]
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for both pods to be indexed: %v, %v", got, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// afterOutage checks, from the moment records can flow again: the live
// pod keeps all its blocks throughout, and the dead one stays while the
// grace runs and leaves within the window plus the grace (plus a second
// of slack for the pipeline), which it must.
func (f *outageFleet) afterOutage(t *testing.T, ctx context.Context, c *client.Client, back time.Time) {
	t.Helper()
	deadline := back.Add(2*outageWindow + 2*time.Second)
	for {
		got, err := gpuBlocks(ctx, c)
		if err != nil {
			// indexd may still be starting (whole-stack case).
			if time.Now().After(deadline) {
				t.Fatalf("ListEndpoints after the outage: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if got[f.live.Pod] != f.blocks {
			t.Fatalf("%.1f s after the outage the live pod has %d GPU blocks, want %d: the outage aged a live pod",
				time.Since(back).Seconds(), got[f.live.Pod], f.blocks)
		}
		_, deadThere := got[f.dead.Pod]
		if since := time.Since(back); deadThere && since < outageWindow/2 && got[f.dead.Pod] != 4 {
			t.Fatalf("the dead pod lost blocks %.1f s after the outage, within the grace", since.Seconds())
		}
		if !deadThere {
			if since := time.Since(back); since < outageWindow/2 {
				t.Fatalf("the dead pod left %.1f s after the outage, within the grace (%v)", since.Seconds(), outageWindow)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead pod is still indexed %.1f s after the outage; it must leave within the window plus the grace", time.Since(back).Seconds())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The live pod stays after the dead one left.
	time.Sleep(outageWindow)
	got, err := gpuBlocks(ctx, c)
	if err != nil || got[f.live.Pod] != f.blocks {
		t.Fatalf("a window after the dead pod left: %v, %v; want the live pod with %d blocks", got, err, f.blocks)
	}
}

// outageIngester: the short window, and engine-hash mode (the dead pod's
// record is produced by hand, with hashes and no token ids).
func outageIngester(cfg *ingester.Config) {
	cfg.LivenessWindow, cfg.HashMode = outageWindow, keyspace.HashModeEngine
}

// outageLogger logs to stderr when KVINDEX_TEST_LOG is set (a level),
// else nowhere.
func outageLogger() *slog.Logger {
	if lv := os.Getenv("KVINDEX_TEST_LOG"); lv != "" {
		var l slog.Level
		_ = l.UnmarshalText([]byte(lv))
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
	return slog.New(slog.DiscardHandler)
}

// TestOutageThroughPipeline stops, for twice the liveness window, only
// Kafka, and separately the whole standalone stack (etcd, Kafka, the
// ingester and indexd), while a real bridge keeps heartbeating for its
// live engine (DESIGN semantics 8, v1.1): nothing is dropped, and a pod
// that really died leaves once records flow again, within the window
// plus the grace. Before the outage rule, the first records after the gap
// expired every endpoint.
func TestOutageThroughPipeline(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits out twice the liveness window, twice")
	}
	t.Run("kafka_down", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
		defer cancel()
		p := newPipeline(t, 2)
		var down atomic.Bool
		errDown := errors.New("broker down (test)")
		p.kafka.Cluster.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
			p.kafka.Cluster.KeepControl()
			if down.Load() {
				return nil, errDown, true // closes the connection
			}
			return nil, nil, false
		})
		p.ingester("ingester-a", outageIngester)
		c := newClient(t, p.replica().addr)
		f := startOutageFleet(t, ctx, p.kafka.Brokers)
		f.produceDead(t, ctx, p.kafka.Brokers)
		f.waitIndexed(t, ctx, c, 1)

		down.Store(true)
		time.Sleep(2 * outageWindow)
		down.Store(false)
		f.afterOutage(t, ctx, c, time.Now())
	})
	t.Run("whole_stack_down", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
		defer cancel()
		// The first start binds port 0 and the test reads the ports back;
		// the restart must come back on the same ones (the clients and the
		// bridge redial them), so it tries again, a bounded number of times,
		// while another process holds one of them.
		cfg := stack.Config{
			DataDir: t.TempDir(), EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
			MetricsAddr: "127.0.0.1:0", Topic: topic, Partitions: 2, UnsafeNoFsync: true, Ingester: outageIngester,
			Logger: outageLogger(),
		}
		run := func() func() {
			var s *stack.Stack
			var err error
			for try := 1; ; try++ {
				s, err = stack.Start(ctx, cfg)
				var addrErr *stack.AddrError
				inUse := errors.As(err, &addrErr) || errors.Is(err, etcdembed.ErrAddrInUse) || errors.Is(err, syscall.EADDRINUSE)
				if err == nil || !inUse || try == 50 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Fatal(err)
			}
			cfg.EtcdAddr, cfg.KafkaAddr, cfg.GRPCAddr = testutil.HostPort(s.EtcdURL()), s.KafkaAddr(), s.GRPCAddr()
			sctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- s.Run(sctx) }()
			return func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("stack: %v", err)
				}
			}
		}
		stop := run()
		c := newClient(t, cfg.GRPCAddr)
		f := startOutageFleet(t, ctx, []string{cfg.KafkaAddr})
		f.produceDead(t, ctx, []string{cfg.KafkaAddr})
		f.waitIndexed(t, ctx, c, 1)

		stop()
		time.Sleep(2 * outageWindow)
		stop = run()
		f.afterOutage(t, ctx, c, time.Now())
		if err := f.bridge.Stop(); err != nil { // while its broker is still up
			t.Errorf("bridge: %v", err)
		}
		stop()
	})
}

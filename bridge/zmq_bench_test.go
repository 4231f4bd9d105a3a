package bridge

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// BenchmarkSubReceive compares the two ways the bind mode could take
// messages from 64 connected publishers (simulated engines dialing a bound
// endpoint and publishing at once), receive side only, no Kafka:
//
//   - zmtp: what the bridge does (zmtp.go): its own listener, one goroutine
//     per accepted connection running zmq4's ZMTP handshake (zmq4.Open)
//     and reading messages through the frame limiter;
//   - zmq4_socket: go-zeromq/zmq4's SUB Socket type, which llm-d's
//     subscriber uses: Listen, subscribe, one Recv loop.
//
// Both report msgs/s; the record of which to keep is in docs/bridge.md.
func BenchmarkSubReceive(b *testing.B) {
	for _, impl := range []string{"zmtp", "zmq4_socket"} {
		b.Run(impl, func(b *testing.B) { benchSubReceive(b, impl) })
	}
}

func benchSubReceive(b *testing.B, impl string) {
	const publishers = 64
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Minute))
	defer cancel()
	per := max(1, b.N/publishers)
	n := per * publishers
	w := enginesim.NewWorkload(5, enginesim.WorkloadConfig{Capacity: 256})
	payloads := make([][]byte, per)
	for i := range payloads {
		payloads[i] = w.Next().MustEncode()
	}
	var got atomic.Int64
	done := make(chan struct{})
	count := func() {
		if got.Add(1) == int64(n) {
			close(done)
		}
	}
	var addr string
	var stop func()
	switch impl {
	case "zmtp":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addr = l.Addr().String()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var conns []net.Conn
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				raw, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, raw)
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					zc, err := openZMTP(ctx, raw, "", zmq4.Sub, true, 5*time.Second, 16<<20)
					if err != nil {
						return
					}
					defer zc.close()
					if zc.zc.SendMsg(zmq4.NewMsg([]byte{1})) != nil {
						return
					}
					for {
						m, err := zc.recv()
						if err != nil {
							return
						}
						if len(m.Frames) == 3 {
							count()
						}
					}
				}()
			}
		}()
		stop = func() {
			l.Close()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		}
	case "zmq4_socket":
		sctx, scancel := context.WithCancel(ctx)
		sub := zmq4.NewSub(sctx)
		if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
			b.Fatal(err)
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			b.Fatal(err)
		}
		addr = sub.Addr().String()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := sub.Recv()
				if err != nil {
					if errors.Is(err, context.Canceled) || sctx.Err() != nil {
						return
					}
					continue
				}
				if len(m.Frames) == 3 {
					count()
				}
			}
		}()
		stop = func() {
			scancel()
			sub.Close()
			wg.Wait()
		}
	}
	engines := make([]*enginesim.Engine, publishers)
	for i := range engines {
		eng, err := enginesim.New(enginesim.Config{Connect: addr, BufferSize: 1, HWM: per + 1, Topic: "kv@p@m"})
		if err != nil {
			b.Fatal(err)
		}
		engines[i] = eng
		if err := eng.WaitSubscriptions(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, eng := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range payloads {
				if _, err := eng.Publish(ctx, p); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("received %d of %d messages", got.Load(), n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	for _, eng := range engines {
		eng.Close()
	}
	stop()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

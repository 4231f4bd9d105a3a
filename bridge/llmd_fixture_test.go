package bridge_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testutil"
)

// The recordings of llm-d-inference-sim (testdata/llmd-sim, README there):
// one in its default array event format, one in the map format.
var recordings = []string{"array", "map"}

func loadRecording(t *testing.T, name string) *bridgetest.Recording {
	t.Helper()
	r, err := bridgetest.LoadRecording("../testdata/llmd-sim", name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// recordedEngine is a simulated engine that sends the recorded frames:
// the recording's topic, numbering from 1, replay answers with the topic
// frame. TestRecordedReplayFramesReproduced checks that its replay answers
// are the recorded bytes.
func recordedEngine(t *testing.T, rec *bridgetest.Recording, mod func(*enginesim.Config)) *enginesim.Engine {
	t.Helper()
	cfg := enginesim.DefaultConfig()
	cfg.Topic = rec.Topic
	cfg.FirstSeq = 1
	cfg.ReplayTopicFrame = true
	if mod != nil {
		mod(&cfg)
	}
	eng, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// replayAnswer asks a replay socket for everything from seq from and
// returns the answer's messages up to the end marker.
func replayAnswer(t *testing.T, ctx context.Context, addr string, from uint64) [][][]byte {
	t.Helper()
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := raw.SetDeadline(time.Now().Add(testutil.Timeout(10 * time.Second))); err != nil {
		t.Fatal(err)
	}
	zc, err := zmq4.Open(raw, null.Security(), zmq4.Dealer, nil, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			t.Fatal(err)
		}
		if m.Type == zmq4.CmdMsg {
			continue
		}
		out = append(out, m.Frames)
		if n := len(m.Frames); n >= 2 && len(m.Frames[n-2]) == 8 && binary.BigEndian.Uint64(m.Frames[n-2]) == ^uint64(0) {
			return out
		}
	}
}

// TestRecordedReplayFramesReproduced: the simulated engine, publishing the
// recorded batches, answers replay requests with exactly the bytes
// llm-d-inference-sim answered, so the bridge tests below replay the
// sim's framing, not an imitation of it.
func TestRecordedReplayFramesReproduced(t *testing.T) {
	for _, name := range recordings {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
			defer cancel()
			rec := loadRecording(t, name)
			answers := rec.ReplayAnswers()
			if len(answers) == 0 {
				t.Fatal("the recording has no replay answer")
			}
			eng := recordedEngine(t, rec, nil)
			batches := rec.Batches()
			published := 0
			for _, ans := range answers {
				want := ans.Messages
				// Publish what the sim had published when it was asked.
				// Its buffer then ended at the answer's last batch.
				last := eng.NextSeq() - 1
				for _, m := range want[:len(want)-1] {
					last = max(last, binary.BigEndian.Uint64(m[2]))
				}
				for published < len(batches) && batches[published].Seq <= last {
					if _, err := eng.Publish(ctx, batches[published].Payload); err != nil {
						t.Fatal(err)
					}
					published++
				}
				if eng.NextSeq() != last+1 {
					t.Fatalf("engine at seq %d, the answer from %d ends at %d", eng.NextSeq(), ans.From, last)
				}
				got := replayAnswer(t, ctx, strings.TrimPrefix(eng.ReplayEndpoint(), "tcp://"), ans.From)
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("replay answer from %d (-recorded +simulated):\n%s", ans.From, d)
				}
			}
		})
	}
}

// fixtureRun replays one recording through a bridge, in the dial or the
// bind mode, following the recording's connections: the batches of the
// first connection live, then a dropped connection that the engine
// redials (bind) or the bridge redials (dial), then the rest. It returns
// the records produced for the pod.
func fixtureRun(t *testing.T, rec *bridgetest.Recording, bind bool) (pod string, got []rec, cfg bridge.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	k := testutil.StartKafka(t, topic, 4)
	consumer := bridgetest.NewConsumer(t, k.Brokers, topic)
	cfg = bridge.DefaultConfig()
	cfg.Brokers, cfg.Topic = k.Brokers, topic
	cfg.HeartbeatInterval = time.Hour
	cfg.GracePeriod = 0
	cfg.ReconnectBackoff = 10 * time.Millisecond
	cfg.MaxReconnectBackoff = 50 * time.Millisecond
	cfg.Registry = prometheus.NewRegistry()
	var eng *enginesim.Engine
	var r *bridgetest.Running
	if bind {
		podName, _, _ := strings.Cut(strings.TrimPrefix(rec.Topic, "kv@"), "@")
		host, _, err := net.SplitHostPort(podName)
		if err != nil {
			t.Fatal(err)
		}
		// The pod's replay socket is open before the bridge learns its port.
		ls, port, err := enginesim.ListenSamePort(ctx, []string{host})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ls[0].Close() }) // the engine's from New on; twice is harmless
		cfg.Listen = "tcp://127.0.0.1:0"
		cfg.ReplayPattern = "tcp://{host}:" + strconv.Itoa(port)
		b, err := bridge.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r = bridgetest.Start(t, b)
		if err := bridgetest.WaitReady(ctx, b); err != nil {
			t.Fatal(err)
		}
		eng = recordedEngine(t, rec, func(c *enginesim.Config) {
			c.Connect = strings.TrimPrefix(b.Addr(), "tcp://")
			c.ReplayListener = ls[0]
		})
		pod = podName
	} else {
		eng = recordedEngine(t, rec, nil)
		pod = "default/llm-d-sim-0"
		cfg.Endpoint, cfg.ReplayEndpoint = eng.PubEndpoint(), eng.ReplayEndpoint()
		cfg.Pod, cfg.Model = pod, "sim-model"
		b, err := bridge.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r = bridgetest.Start(t, b)
		if err := bridgetest.WaitReady(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	subs := uint64(1)
	if err := eng.WaitSubscriptions(ctx, subs); err != nil {
		t.Fatal(err)
	}
	conn := 1
	for _, bt := range rec.Batches() {
		if bt.Conn != conn {
			// The recording's connection was dropped and redialed here.
			conn = bt.Conn
			eng.DisconnectAll()
			subs++
			if err := eng.WaitSubscriptions(ctx, subs); err != nil {
				t.Fatal(err)
			}
			if !bind {
				if err := bridgetest.WaitReady(ctx, r.B); err != nil {
					t.Fatal(err)
				}
			}
		}
		seq, err := eng.Publish(ctx, bt.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if seq != bt.Seq {
			t.Fatalf("simulated engine gave seq %d to the batch recorded at %d", seq, bt.Seq)
		}
	}
	got, err := consumer.Read(ctx, len(rec.Batches()))
	if err != nil {
		t.Fatalf("%v; got:\n%s", err, describe(got))
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	rest, err := consumer.ReadAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Partition = 0
	}
	if len(rest) > 0 {
		t.Errorf("records after the last batch:\n%s", describe(rest))
	}
	return pod, got, cfg
}

// TestRecordedFixtures replays llm-d-inference-sim's recorded frames (PUB
// messages numbered from 1, replay answers with the topic frame, a
// dropped connection, the array format's 9-field events and parent 0,
// the map format's nil parents) through the bridge in both modes. Each
// batch must come out once, in order, byte for byte, with no resync; and
// the blocks kvindex's decoder reads from the produced records must be
// the expected index, the blocks an independent decoder found resident
// after each batch.
func TestRecordedFixtures(t *testing.T) {
	for _, name := range recordings {
		for _, bind := range []bool{false, true} {
			mode := map[bool]string{false: "dial", true: "bind"}[bind]
			t.Run(name+"/"+mode, func(t *testing.T) {
				recording := loadRecording(t, name)
				pod, got, cfg := fixtureRun(t, recording, bind)
				var want []rec
				for _, bt := range recording.Batches() {
					want = append(want, bridgetest.BatchRecord(pod, "sim-model", 0, bt.Seq, bt.Payload))
				}
				check(t, "records", want, got)
				checkMetrics(t, cfg, map[string]float64{
					"kvindex_bridge_resyncs_total":            0,
					"kvindex_bridge_dp_rank_mismatches_total": 0,
				})
				resident := map[uint64]bool{}
				dec := events.NewDecoder(nil)
				for _, r := range got {
					seq, _ := r.Seq()
					b, err := dec.Decode(r.Value)
					if err != nil {
						t.Fatalf("seq %d: %v", seq, err)
					}
					if len(b.Skipped) > 0 {
						t.Errorf("seq %d: events skipped: %+v", seq, b.Skipped)
					}
					for _, ev := range b.Events {
						switch ev.Type {
						case events.BlockStored:
							for _, h := range ev.BlockHashes {
								resident[h] = true
							}
						case events.BlockRemoved:
							for _, h := range ev.BlockHashes {
								delete(resident, h)
							}
						case events.AllBlocksCleared:
							clear(resident)
						}
					}
					var have []string
					for h := range resident {
						have = append(have, fmt.Sprintf("%016x", h))
					}
					slices.Sort(have)
					if d := cmp.Diff(recording.ResidentAfter[seq], have, cmpopts.EquateEmpty()); d != "" {
						t.Errorf("blocks resident after seq %d (-expected +decoded):\n%s", seq, d)
					}
				}
			})
		}
	}
}

package e2e

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/e2e/internal/kvevents"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
	"github.com/kvindex/kvindex/wiring/stack"
	"github.com/kvindex/kvindex/wiring/stack/stacktest"
)

const (
	model     = "qwen3-8b"
	blockSize = 16
)

// The pool: three vLLM pods serving port 8000; their bridges name them
// $(POD_IP):8000 (deploy/examples/vllm-sidecar).
var pods = []epptest.Pod{{Name: "vllm-a", IP: "10.0.0.1"}, {Name: "vllm-b", IP: "10.0.0.2"}, {Name: "vllm-c", IP: "10.0.0.3"}}

func podID(i int) string { return pods[i].IP + ":8000" }

// fleet is a kvindex stack in process plus the "bridges" of the pods: it
// produces vLLM KV event batches to Kafka exactly as kvindex bridge does
// (key = pod, headers model, seq, dp_rank, value = the engine's payload).
type fleet struct {
	t   testing.TB
	st  *stack.Stack
	pub *kvevents.Publisher
	kv  *client.Client
}

func startFleet(t testing.TB, st *stack.Stack) *fleet {
	t.Helper()
	if st == nil {
		st = stacktest.Start(t)
	}
	pub, err := kvevents.New([]string{st.KafkaAddr()}, st.Topic())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close(context.Background()) })
	kv, err := client.New(st.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kv.Close() })
	return &fleet{t: t, st: st, pub: pub, kv: kv}
}

// engineHash is one engine's block hash: seeded by the pod, so engines
// hash the same prompt differently (as vLLM does with different
// PYTHONHASHSEEDs or hash algorithms); token mode must not care.
func engineHash(pod string, rank uint32, parent uint64, toks []uint32) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(pod + "/" + strconv.Itoa(int(rank))))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = h.Write(b[:])
	for _, tk := range toks {
		binary.LittleEndian.PutUint32(b[:4], tk)
		_, _ = h.Write(b[:4])
	}
	return h.Sum64()
}

// store publishes one BlockStored batch: pod's rank holds prompt p's
// first n full blocks in medium ("GPU", "CPU"). Extra keys are the ones
// vLLM sends for LoRA and multimodal items (client.TokenBlockExtras).
func (f *fleet) store(pod string, rank uint32, p client.TokenPrompt, n int, medium string) {
	f.t.Helper()
	ev := events.Event{Type: events.BlockStored, BlockSize: blockSize, Medium: medium, LoraName: p.LoRAName}
	var parent uint64
	extras := len(p.MultiModal) > 0 || p.CacheSalt != ""
	for b := range n {
		toks := p.TokenIDs[b*blockSize : (b+1)*blockSize]
		h := engineHash(pod, rank, parent, toks)
		ev.BlockHashes = append(ev.BlockHashes, h)
		for _, tk := range toks {
			ev.TokenIDs = append(ev.TokenIDs, int64(tk))
		}
		if extras {
			var ex []events.Extra
			for _, e := range client.TokenBlockExtras(p, blockSize, b) {
				ex = append(ex, events.Extra{Kind: events.ExtraKind(e.Kind), Data: e.Data})
			}
			ev.ExtraKeys = append(ev.ExtraKeys, ex)
		}
		parent = h
	}
	if extras {
		ev.HasExtraKeys, ev.ExtraKeysLen = true, n
	}
	ctx, cancel := context.WithTimeout(f.t.Context(), 10*time.Second)
	defer cancel()
	if err := f.pub.Publish(ctx, model, pod, rank, []events.Event{ev}); err != nil {
		f.t.Fatal(err)
	}
}

// waitMatch waits until the index answers at least blocks blocks of p on
// (pod, rank): the events have come through Kafka, the ingester, etcd
// and indexd's watch.
func (f *fleet) waitMatch(p client.TokenPrompt, pod string, rank uint32, blocks int) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := f.kv.LookupTokens(f.t.Context(), model, p)
		if err == nil {
			for _, m := range res.Matches {
				if m.Endpoint.Pod == pod && m.Endpoint.DPRank == rank && m.Blocks >= blocks {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the index never answered %d blocks on %s rank %d (last: %+v, %v)", blocks, pod, rank, res, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// prompt is a completions prompt of n words (n tokens with the test
// tokenizer) and its token prompt.
func prompt(tag string, n int) (string, client.TokenPrompt) {
	w := make([]string, n)
	for i := range w {
		w[i] = tag + strconv.Itoa(i)
	}
	text := strings.Join(w, " ")
	return text, client.TokenPrompt{TokenIDs: epptest.Words(text)}
}

// eppConfig is deploy/examples/gie/epp-config-kvindex.yaml pointed at
// this stack and this tokenizer, with extra producer parameters (YAML
// lines at the parameters' indentation) and, when tierScorer, the tier
// scorer added to the profile.
func eppConfig(t testing.TB, target, tokenizerURL string, extra []string, tierScorer bool) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "examples", "gie", "epp-config-kvindex.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	const exampleTarget = "target: dns:///kvindex-indexd.kvindex.svc.cluster.local:50051"
	if !strings.Contains(s, exampleTarget) {
		t.Fatalf("the example config's target changed; update this test")
	}
	s = strings.Replace(s, exampleTarget, "target: "+target, 1)
	params := "      tokenizer:\n        url: " + tokenizerURL + "\n"
	for _, l := range extra {
		params += "      " + l + "\n"
	}
	s = strings.Replace(s, "      fallback: approximate\n", "      fallback: approximate\n"+params, 1)
	if tierScorer {
		// The tier scorer takes the prefix scorer's place, at its weight
		// (docs/router.md).
		const prefixRef = "      - pluginRef: prefix-cache-scorer\n"
		if !strings.Contains(s, prefixRef) {
			t.Fatalf("the example config's profile no longer references prefix-cache-scorer; update this test")
		}
		s = strings.Replace(s, "schedulingProfiles:", "  - type: kvindex-tier-scorer\nschedulingProfiles:", 1)
		s = strings.Replace(s, prefixRef, "      - pluginRef: kvindex-tier-scorer\n", 1)
	}
	return []byte(s)
}

// metricValue gathers m and returns the summed value of the series of
// name whose labels include labels.
func metricValue(t *testing.T, m *gie.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, mt := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range mt.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			sum += mt.GetCounter().GetValue()
		}
	}
	return sum
}

// osReadExample reads a file of deploy/examples/gie in place.
func osReadExample(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", "..", "deploy", "examples", "gie", name))
}

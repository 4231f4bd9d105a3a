package sim

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

func TestOracle(t *testing.T) {
	k, ids := req(1, 2, 3, 4)
	gpuHolder := NewPod(10, 10, 1) // all four on GPU
	gpuHolder.Serve(k, ids)
	short := NewPod(10, 10, 2) // two on GPU
	ks, idss := req(1, 2)
	short.Serve(ks, idss)
	cold := NewPod(10, 10, 3)
	rng := rand.New(rand.NewPCG(1, 1))
	pods := []*Pod{cold, short, gpuHolder}
	if p, held := oracle(matchPods(pods, []bool{true, true, true}, k), rng); p != 2 || held != 4 {
		t.Errorf("oracle chose pod %d (%d blocks), want the longest holder 2 (4)", p, held)
	}
	if p, held := oracle(matchPods(pods, []bool{true, true, false}, k), rng); p != 1 || held != 2 {
		t.Errorf("with the holder capped: pod %d (%d blocks), want 1 (2)", p, held)
	}
	// CPU blocks count CPUHitWeight: 3 on CPU after 1 on GPU (1+2.4)
	// loses to 4 on GPU but beats 3 on GPU.
	cpuHolder := NewPod(4, 10, 4)
	cpuHolder.Serve(k, ids)
	kx, idsx := req(7, 8, 9)
	cpuHolder.Serve(kx, idsx) // pushes blocks 2, 3, 4 of k to CPU
	if g, c := cpuHolder.Match(k); g != 1 || c != 3 {
		t.Fatalf("setup: the CPU holder has %d GPU, %d CPU blocks", g, c)
	}
	three := NewPod(10, 10, 5)
	k3, ids3 := req(1, 2, 3)
	three.Serve(k3, ids3)
	if p, _ := oracle(matchPods([]*Pod{cpuHolder, three}, []bool{true, true}, k), rng); p != 0 {
		t.Errorf("1 GPU + 3 CPU (3.4) vs 3 GPU: chose pod %d, want 0", p)
	}
	if p, _ := oracle(matchPods([]*Pod{cpuHolder, gpuHolder}, []bool{true, true}, k), rng); p != 1 {
		t.Errorf("1 GPU + 3 CPU vs 4 GPU: chose pod %d, want 1", p)
	}
	// Ties go to every tied pod some of the time.
	seen := map[int]bool{}
	for range 200 {
		p, _ := oracle(matchPods([]*Pod{cold, NewPod(10, 0, 9), cold}, []bool{true, true, true}, k), rng)
		seen[p] = true
	}
	if len(seen) != 3 {
		t.Errorf("ties went to %v only", seen)
	}
}

func TestTierHeadroom(t *testing.T) {
	k, ids := req(1, 2, 3, 4)
	gpuHolder := NewPod(10, 10, 1) // 4 on GPU: value 4
	gpuHolder.Serve(k, ids)
	cpuHolder := NewPod(4, 10, 2) // 1 on GPU, 3 on CPU: value 3.4
	cpuHolder.Serve(k, ids)
	kx, idsx := req(7, 8, 9)
	cpuHolder.Serve(kx, idsx)
	if g, c := cpuHolder.Match(k); g != 1 || c != 3 {
		t.Fatalf("setup: the CPU holder has %d GPU, %d CPU blocks", g, c)
	}
	three := NewPod(10, 10, 4) // 3 on GPU: 3
	k3, ids3 := req(1, 2, 3)
	three.Serve(k3, ids3)
	cold := NewPod(10, 10, 5)
	for _, tc := range []struct {
		name    string
		pods    []*Pod
		allowed []bool
		keys    []uint64
		want    float64
	}{
		{"nobody holds it", []*Pod{cold, cold}, []bool{true, true}, k, 0},
		{"one longest holder", []*Pod{gpuHolder, three, cold}, []bool{true, true, true}, k, 0},
		{"GPU and CPU holders of the same length", []*Pod{gpuHolder, cpuHolder}, []bool{true, true}, k, 4 - (4+3.4)/2},
		{"the GPU holder capped", []*Pod{gpuHolder, cpuHolder}, []bool{false, true}, k, 0},
		// 1 GPU + 3 CPU (3.4) is longest; 3 on GPU (3) is shorter and
		// worth less: none.
		{"shorter GPU holder worth less", []*Pod{cpuHolder, three}, []bool{true, true}, k, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tierHeadroom(matchPods(tc.pods, tc.allowed, tc.keys))
			if diff := got - tc.want; diff > 1e-9 || diff < -1e-9 {
				t.Errorf("tierHeadroom = %v, want %v", got, tc.want)
			}
		})
	}
	// A longer holder mostly on CPU against a shorter one all on GPU
	// and worth more: the tier-blind choice (the longest) loses the
	// difference.
	k7, ids7 := req(1, 2, 3, 4, 5, 6, 7)
	mostlyCPU := NewPod(7, 10, 6)
	mostlyCPU.Serve(k7, ids7)
	ky, idsy := req(21, 22, 23, 24, 25, 26)
	mostlyCPU.Serve(ky, idsy) // pushes blocks 2-7 of k7 to CPU
	g, c := mostlyCPU.Match(k7)
	value := float64(g) + CPUHitWeight*float64(c)
	if g+c != 7 || value >= 6 {
		t.Fatalf("setup: the mostly-CPU holder has %d GPU, %d CPU blocks (value %v), want 7 blocks worth under 6", g, c, value)
	}
	six := NewPod(10, 10, 7)
	k6, ids6 := req(1, 2, 3, 4, 5, 6)
	six.Serve(k6, ids6)
	if got, want := tierHeadroom(matchPods([]*Pod{mostlyCPU, six}, []bool{true, true}, k7)), 6-value; got < want-1e-9 || got > want+1e-9 {
		t.Errorf("shorter GPU holder worth more: tierHeadroom = %v, want %v", got, want)
	}
}

// TestConfigsLoad: every strategy's config, built from the repository's
// example configs, loads through GIE's loader, and the kvindex ones run
// the tokenized-prompt plugin before kvindex's producer in every load.
func TestConfigsLoad(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "..", "deploy", "examples", "gie")
	cfgs, err := Configs(dir, "127.0.0.1:1", "http://127.0.0.1:1/tokenize", 131072)
	if err != nil {
		t.Fatal(err)
	}
	registerPlugins()
	gie.Register()
	for _, s := range []string{StrategyRandom, StrategyApprox, StrategyKVIndex, StrategyKVIndexTier} {
		raw, ok := cfgs[s]
		if !ok {
			t.Fatalf("no %s config", s)
		}
		if !strings.Contains(string(raw), recorderType) {
			t.Errorf("%s: no route recorder", s)
		}
		loads := 1
		if s == StrategyKVIndex || s == StrategyKVIndexTier {
			loads = 10
			for _, want := range []string{"blockSize: 512", "maxPromptTokens: 131072", "target: 127.0.0.1:1"} {
				if !strings.Contains(string(raw), want) {
					t.Errorf("%s config lacks %q", s, want)
				}
			}
		}
		for range loads {
			_, _, _, order, err := epptest.Load(t.Context(), raw, nil)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			tok, prod := -1, -1
			for i, o := range order {
				if strings.HasPrefix(o, tokensType+"/") {
					tok = i
				}
				if strings.HasPrefix(o, "kvindex-prefix-cache-producer/") {
					prod = i
				}
			}
			if (s == StrategyKVIndex || s == StrategyKVIndexTier) && (tok < 0 || prod < 0 || tok > prod) {
				t.Fatalf("%s: PrepareData order %v: the tokenized-prompt plugin must run before the producer", s, order)
			}
		}
	}
	if _, err := Configs(t.TempDir(), "x", "y", 1); err == nil {
		t.Error("a directory without the example configs was accepted")
	}
}

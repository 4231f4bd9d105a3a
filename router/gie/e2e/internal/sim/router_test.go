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
	if p, held := oracle(pods, []bool{true, true, true}, k, rng); p != 2 || held != 4 {
		t.Errorf("oracle chose pod %d (%d blocks), want the longest holder 2 (4)", p, held)
	}
	if p, held := oracle(pods, []bool{true, true, false}, k, rng); p != 1 || held != 2 {
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
	if p, _ := oracle([]*Pod{cpuHolder, three}, []bool{true, true}, k, rng); p != 0 {
		t.Errorf("1 GPU + 3 CPU (3.4) vs 3 GPU: chose pod %d, want 0", p)
	}
	if p, _ := oracle([]*Pod{cpuHolder, gpuHolder}, []bool{true, true}, k, rng); p != 1 {
		t.Errorf("1 GPU + 3 CPU vs 4 GPU: chose pod %d, want 1", p)
	}
	// Ties go to every tied pod some of the time.
	seen := map[int]bool{}
	for range 200 {
		p, _ := oracle([]*Pod{cold, NewPod(10, 0, 9), cold}, []bool{true, true, true}, k, rng)
		seen[p] = true
	}
	if len(seen) != 3 {
		t.Errorf("ties went to %v only", seen)
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

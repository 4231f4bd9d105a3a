package fleetsim

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestEventsReproduceCaches replays the fleet's emitted events through the
// wire format into the reference model and checks that the model ends up
// holding exactly what the simulated caches hold: the events are a faithful
// description of the caches.
//
// It runs in both hash modes: in token mode the model keys every block by
// its tokens and must key every event (no orphan store, no unknown
// placeholder), so the fleet's event order keeps each offloaded block's
// engine hash known until its CPU placeholder is stored.
func TestEventsReproduceCaches(t *testing.T) {
	reqs, err := LoadTrace(filepath.Join("..", "..", "..", "testdata", "mooncake", "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []keyspace.HashMode{keyspace.HashModeEngine, keyspace.HashModeToken} {
		t.Run(string(mode), func(t *testing.T) { testEventsReproduceCaches(t, reqs[:2000], mode) })
	}
}

func testEventsReproduceCaches(t *testing.T, reqs []Request, mode keyspace.HashMode) {
	f, err := New(Config{Endpoints: 4, GPUBlocks: 64, CPUBlocks: 128, TokensPerBlock: 4})
	if err != nil {
		t.Fatal(err)
	}
	m := refmodel.New(refmodel.Config{HashMode: mode})
	// key maps an engine hash to what the model stores it under: itself,
	// or in token mode the block's token key (a trace id names its whole
	// prefix, so each engine hash has one key).
	key := map[uint64]uint64{}
	const model = "mooncake"
	for n, req := range reqs {
		hs, ks := f.Hashes(req), f.Keys(req)
		if len(ks) != len(hs) {
			t.Fatalf("request %d: %d hashes, %d token keys", n, len(hs), len(ks))
		}
		for j, h := range hs {
			k := h
			if mode == keyspace.HashModeToken {
				k = ks[j]
			}
			if old, ok := key[h]; ok && old != k {
				t.Fatalf("request %d: block %x keyed %x and %x", n, h, old, k)
			}
			key[h] = k
		}
		i, evs := f.Serve(req)
		payload, err := events.Encode(events.Batch{TS: float64(n), Events: evs}, events.EncodingMap)
		if err != nil {
			t.Fatal(err)
		}
		if out := m.Apply(refmodel.Record{Key: f.Pod(i), Headers: map[string]string{"model": model}, Value: payload}); out != refmodel.Applied {
			t.Fatalf("request %d: model skipped the batch: %s", n, out)
		}
	}
	index := map[string]int{}
	for k := 0; k < f.Endpoints(); k++ {
		index[f.Pod(k)] = k
	}
	got := map[int]map[tier.Tier][]uint64{}
	for _, b := range m.Blocks() {
		i := index[b.Endpoint.Pod]
		if got[i] == nil {
			got[i] = map[tier.Tier][]uint64{}
		}
		got[i][b.Tier] = append(got[i][b.Tier], b.Hash)
	}
	if sk := m.SkippedEvents(); len(sk) != 0 {
		t.Fatalf("model skipped events: %v", sk)
	}
	for i := 0; i < f.Endpoints(); i++ {
		gpu, cpu := f.Contents(i)
		for k := range gpu {
			gpu[k] = key[gpu[k]]
		}
		for k := range cpu {
			cpu[k] = key[cpu[k]]
		}
		slices.Sort(gpu)
		slices.Sort(cpu)
		if !slices.Equal(gpu, got[i][tier.GPU]) || !slices.Equal(cpu, got[i][tier.CPU]) {
			t.Fatalf("endpoint %d: caches hold %d gpu / %d cpu blocks, events describe %d / %d", i, len(gpu), len(cpu), len(got[i][tier.GPU]), len(got[i][tier.CPU]))
		}
		if len(gpu) != 64 || len(cpu) != 128 {
			t.Fatalf("endpoint %d: caches not full after 2000 requests: %d / %d", i, len(gpu), len(cpu))
		}
	}
	if f.Stats.GPUHits == 0 || f.Stats.CPUHits == 0 || f.Stats.Misses == 0 {
		t.Fatalf("stats %+v: want GPU hits, CPU hits and misses", f.Stats)
	}
}

func TestBlockHashIsSaltedBijection(t *testing.T) {
	seen := map[uint64]bool{}
	for salt := uint64(0); salt < 4; salt++ {
		for id := uint64(0); id < 10000; id++ {
			h := BlockHash(salt, id)
			if seen[h] {
				t.Fatalf("collision at salt %d id %d", salt, id)
			}
			seen[h] = true
		}
	}
}

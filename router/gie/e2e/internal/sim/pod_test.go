package sim

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/events"
)

// req builds a request's full-block keys and ids from ids.
func req(ids ...uint64) ([]uint64, []uint64) { return chainKeys(ids), ids }

// kinds summarises events as "type/medium/blocks".
func kinds(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		name := map[events.Type]string{events.BlockStored: "stored", events.BlockRemoved: "removed"}[e.Type]
		out = append(out, name+"/"+e.Medium+"/"+strconv.Itoa(len(e.BlockHashes)))
	}
	return out
}

func TestPodServeHitsAndStores(t *testing.T) {
	p := NewPod(10, 0, 1)
	k, ids := req(1, 2, 3)
	s := p.Serve(k, ids)
	if s.GPUHits != 0 || s.CPUHits != 0 || s.Stored != 3 {
		t.Fatalf("cold serve: %+v", s)
	}
	if diff := cmp.Diff([]string{"stored/GPU/3"}, kinds(s.Events)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	ev := s.Events[0]
	if ev.HasParent || ev.BlockSize != BlockTokens || len(ev.TokenIDs) != 3*BlockTokens {
		t.Errorf("store: parent %v, block size %d, %d tokens", ev.HasParent, ev.BlockSize, len(ev.TokenIDs))
	}
	if int64(AppendBlockTokens(nil, 2, 1)[0]) != ev.TokenIDs[BlockTokens] {
		t.Error("block 2's tokens are not the ones of its id")
	}
	// The same prefix, one more block: three hits, one store chained on
	// block 3's engine hash.
	k2, ids2 := req(1, 2, 3, 4)
	s = p.Serve(k2, ids2)
	if s.GPUHits != 3 || s.Stored != 1 {
		t.Fatalf("warm serve: %+v", s)
	}
	if e := s.Events[0]; !e.HasParent || e.ParentHash != p.engineHash(k2[2]) {
		t.Errorf("the new block's parent is %x (has %v), want block 3's engine hash", e.ParentHash, e.HasParent)
	}
	// A different second block: the prefix ends at the first miss.
	k3, _ := req(1, 9, 3)
	if g, c := p.Match(k3); g != 1 || c != 0 {
		t.Errorf("Match = %d, %d; want 1, 0", g, c)
	}
}

func TestPodEnginesHashDifferently(t *testing.T) {
	k, ids := req(1, 2)
	a, b := NewPod(4, 0, 1).Serve(k, ids), NewPod(4, 0, 2).Serve(k, ids)
	if a.Events[0].BlockHashes[0] == b.Events[0].BlockHashes[0] {
		t.Error("two pods' engines hash a block alike")
	}
	if !cmp.Equal(a.Events[0].TokenIDs, b.Events[0].TokenIDs) {
		t.Error("two pods store different tokens for one block")
	}
}

// TestPodEvictsTailsFirst: a request's blocks are freed tail first, so
// under pressure the tail goes before the head, and a GPU eviction lands
// on the CPU tier (stored there before it is removed from GPU).
func TestPodEvictsTailsFirst(t *testing.T) {
	p := NewPod(4, 2, 7)
	k, ids := req(1, 2, 3, 4)
	p.Serve(k, ids)
	// Two new blocks: the two coldest go, which are the tail (3, 4).
	kn, idsn := req(10, 11)
	s := p.Serve(kn, idsn)
	if diff := cmp.Diff([]string{"stored/CPU/2", "removed/GPU/2", "stored/GPU/2"}, kinds(s.Events)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	want := []uint64{p.engineHash(k[3]), p.engineHash(k[2])}
	if diff := cmp.Diff(want, s.Events[1].BlockHashes); diff != "" {
		t.Errorf("evicted (-want +got):\n%s", diff)
	}
	// The head is still on GPU, the tail on CPU: a CPU hit after GPU hits.
	if g, c := p.Match(k); g != 2 || c != 2 {
		t.Errorf("Match = %d GPU, %d CPU; want 2, 2", g, c)
	}
	// Serving it again loads the tail back (stores on GPU, chained on
	// block 2), evicting the other request to CPU, which drops its
	// oldest.
	s = p.Serve(k, ids)
	if s.GPUHits != 2 || s.CPUHits != 2 || s.Stored != 2 {
		t.Fatalf("serve with CPU hits: %+v", s)
	}
	if diff := cmp.Diff([]string{"stored/CPU/2", "removed/CPU/2", "removed/GPU/2", "stored/GPU/2"}, kinds(s.Events)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if gpu, cpu := p.Blocks(); gpu != 4 || cpu != 2 {
		t.Errorf("holds %d GPU, %d CPU blocks; want 4, 2", gpu, cpu)
	}
}

// TestPodNeverExceedsCapacity: random traffic never overfills a tier,
// and every event's blocks are consistent with what the pod holds.
func TestPodNeverExceedsCapacity(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := NewPod(50, 30, 3)
	present := map[string]map[uint64]bool{MediumGPU: {}, MediumCPU: {}}
	for range 2000 {
		n := 1 + rng.IntN(20)
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = uint64(rng.IntN(60))
		}
		k, _ := req(ids...)
		s := p.Serve(k, ids)
		for _, e := range s.Events {
			for _, h := range e.BlockHashes {
				switch e.Type {
				case events.BlockStored:
					present[e.Medium][h] = true
				case events.BlockRemoved:
					if !present[e.Medium][h] {
						t.Fatalf("removed %x from %s, which it never stored", h, e.Medium)
					}
					delete(present[e.Medium], h)
				}
			}
		}
		gpu, cpu := p.Blocks()
		if gpu > 50 || cpu > 30 {
			t.Fatalf("holds %d GPU, %d CPU blocks", gpu, cpu)
		}
		if len(present[MediumGPU]) != gpu || len(present[MediumCPU]) != cpu {
			t.Fatalf("events say %d GPU, %d CPU blocks; the pod holds %d, %d", len(present[MediumGPU]), len(present[MediumCPU]), gpu, cpu)
		}
	}
}

func TestPodStoresInChunks(t *testing.T) {
	ids := make([]uint64, 40)
	for i := range ids {
		ids[i] = uint64(i)
	}
	k, _ := req(ids...)
	s := NewPod(100, 0, 1).Serve(k, ids)
	if diff := cmp.Diff([]string{"stored/GPU/16", "stored/GPU/16", "stored/GPU/8"}, kinds(s.Events)); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	for i, e := range s.Events[1:] {
		if !e.HasParent || e.ParentHash != s.Events[i].BlockHashes[len(s.Events[i].BlockHashes)-1] {
			t.Errorf("chunk %d is not chained on the previous chunk's last block", i+1)
		}
	}
}

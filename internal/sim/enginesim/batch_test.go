package enginesim

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestBatchDecodes checks every encoding against the repository's decoder:
// what the simulator publishes is what the ingester will read.
func TestBatchDecodes(t *testing.T) {
	b := Batch{
		TS:      1733000000.25,
		Rank:    3,
		HasRank: true,
		Events: []Event{
			BlockStored{BlockHashes: []uint64{0xfedcba9876543210, 2}, TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 2},
			BlockStored{BlockHashes: []uint64{3}, ParentHash: 2, HasParent: true, Medium: "CPU", LoraName: "adapter"},
			BlockRemoved{BlockHashes: []uint64{2}, Medium: "GPU"},
			BlockStored{BlockHashes: []uint64{9}, GroupIdx: 1},
			AllBlocksCleared{},
		},
	}
	want := events.Batch{
		TS: 1733000000.25, Rank: 3, HasRank: true,
		Events: []events.Event{
			{Type: events.BlockStored, Index: 0, BlockHashes: []uint64{0xfedcba9876543210, 2}, TokenIDs: []int64{1, 2, 3, 4}, BlockSize: 2, Tier: tier.GPU, KVCacheSpecKind: specKind},
			{Type: events.BlockStored, Index: 1, BlockHashes: []uint64{3}, ParentHash: 2, HasParent: true, Medium: "CPU", Tier: tier.CPU, LoraName: "adapter", KVCacheSpecKind: specKind},
			{Type: events.BlockRemoved, Index: 2, BlockHashes: []uint64{2}, Medium: "GPU", Tier: tier.GPU},
			// The decoder keeps every KV-cache group (DESIGN v1.1): which
			// one an endpoint indexes is the ingester's rule.
			{Type: events.BlockStored, Index: 3, BlockHashes: []uint64{9}, Tier: tier.GPU, GroupIdx: 1, KVCacheSpecKind: specKind},
			{Type: events.AllBlocksCleared, Index: 4},
		},
	}
	for _, tc := range []struct {
		name string
		opts EncodeOptions
	}{
		{"tagged_map", EncodeOptions{}},
		{"tagged_array", EncodeOptions{Arrays: true}},
		{"tagged_map_digests", EncodeOptions{Digests: true}},
		{"tagged_array_digests", EncodeOptions{Arrays: true, Digests: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := b.EncodeWith(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got, err := events.NewDecoder(nil).Decode(p)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got, cmpopts.IgnoreFields(events.Skip{}, "Detail")); d != "" {
				t.Errorf("decoded batch (-want +got):\n%s", d)
			}
		})
	}
}

func TestBatchWithoutRank(t *testing.T) {
	p, err := Batch{TS: 1, Events: []Event{AllBlocksCleared{}}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := events.NewDecoder(nil).Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.HasRank || len(got.Events) != 1 {
		t.Errorf("decoded %+v, want no rank and one event", got)
	}
}

// TestWorkloadResident replays a workload's batches through the decoder
// into a presence set and checks it against the workload's own account.
func TestWorkloadResident(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  WorkloadConfig
	}{
		{"defaults", WorkloadConfig{}},
		{"small_cache_evicts", WorkloadConfig{Capacity: 20, RequestsPerBatch: 6}},
		{"clears", WorkloadConfig{Capacity: 64, ClearEvery: 7, Medium: "CPU"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const seed = 42
			w := NewWorkload(seed, tc.cfg)
			dec := events.NewDecoder(nil)
			present := map[uint64]bool{}
			removes := 0
			for i := range 300 {
				p, err := w.Next().Encode()
				if err != nil {
					t.Fatal(err)
				}
				b, err := dec.Decode(p)
				if err != nil {
					t.Fatalf("batch %d: %v", i, err)
				}
				if len(b.Skipped) > 0 {
					t.Fatalf("batch %d skipped events: %v", i, b.Skipped)
				}
				for _, ev := range b.Events {
					switch ev.Type {
					case events.BlockStored:
						for _, h := range ev.BlockHashes {
							if present[h] {
								t.Fatalf("batch %d stores resident block %x", i, h)
							}
							present[h] = true
						}
					case events.BlockRemoved:
						removes++
						for _, h := range ev.BlockHashes {
							if !present[h] {
								t.Fatalf("batch %d removes absent block %x", i, h)
							}
							delete(present, h)
						}
					case events.AllBlocksCleared:
						clear(present)
					}
				}
			}
			var got []uint64
			for h := range present {
				got = append(got, h)
			}
			if d := cmp.Diff(w.Resident(), got, cmpopts.SortSlices(func(a, b uint64) bool { return a < b })); d != "" {
				t.Errorf("seed %d: resident blocks (-workload +decoded):\n%s", seed, d)
			}
			if tc.cfg.Capacity > 0 && tc.cfg.Capacity < 100 && removes == 0 {
				t.Errorf("seed %d: a %d-block cache never evicted", seed, tc.cfg.Capacity)
			}
		})
	}
}

func TestBatchEncodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		ev   Event
	}{
		{"nil_event", nil},
		{"negative_block_size", BlockStored{BlockHashes: []uint64{1}, BlockSize: -1}},
		{"block_size_past_uint32", BlockStored{BlockHashes: []uint64{1}, BlockSize: 1 << 32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p, err := (Batch{TS: 1, Events: []Event{tc.ev}}).Encode(); err == nil {
				t.Fatalf("Encode succeeded with %d bytes", len(p))
			}
		})
	}
}

package ingester

import (
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestEngineMapLifetime: an entry lives while its block is present in any
// tier, and the count of entries stays exact through every change.
func TestEngineMapLifetime(t *testing.T) {
	type step struct {
		op     string // store, remove, clear_tier, clear
		h, key uint64
		tier   tier.Tier
	}
	tests := []struct {
		name    string
		steps   []step
		want    engineMap
		entries int
	}{
		{
			name:    "store_twice_in_two_tiers_is_one_entry",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 1, key: 10, tier: tier.CPU}},
			want:    engineMap{1: {key: 10, tiers: bit(tier.GPU) | bit(tier.CPU)}},
			entries: 1,
		},
		{
			name:    "removed_from_one_of_two_tiers_lives",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 1, key: 10, tier: tier.CPU}, {op: "remove", h: 1, tier: tier.GPU}},
			want:    engineMap{1: {key: 10, tiers: bit(tier.CPU)}},
			entries: 1,
		},
		{
			name:    "removed_from_its_last_tier_goes",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 2, key: 20, tier: tier.GPU}, {op: "remove", h: 1, tier: tier.GPU}},
			want:    engineMap{2: {key: 20, tiers: bit(tier.GPU)}},
			entries: 1,
		},
		{
			name:    "removal_of_an_unknown_hash_is_a_no_op",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "remove", h: 9, tier: tier.GPU}},
			want:    engineMap{1: {key: 10, tiers: bit(tier.GPU)}},
			entries: 1,
		},
		{
			name:    "removal_from_a_tier_it_is_not_in_keeps_it",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "remove", h: 1, tier: tier.Disk}},
			want:    engineMap{1: {key: 10, tiers: bit(tier.GPU)}},
			entries: 1,
		},
		{
			name: "tier_clear_drops_what_only_that_tier_held",
			steps: []step{
				{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 2, key: 20, tier: tier.GPU}, {op: "store", h: 2, key: 20, tier: tier.CPU},
				{op: "store", h: 3, key: 30, tier: tier.CPU}, {op: "clear_tier", tier: tier.GPU},
			},
			want:    engineMap{2: {key: 20, tiers: bit(tier.CPU)}, 3: {key: 30, tiers: bit(tier.CPU)}},
			entries: 2,
		},
		{
			name:    "clear_drops_everything",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 2, key: 20, tier: tier.CPU}, {op: "clear"}},
			want:    nil,
			entries: 0,
		},
		{
			name:    "a_new_key_for_a_known_hash_replaces_it",
			steps:   []step{{op: "store", h: 1, key: 10, tier: tier.GPU}, {op: "store", h: 1, key: 10, tier: tier.CPU}, {op: "store", h: 1, key: 11, tier: tier.Disk}},
			want:    engineMap{1: {key: 11, tiers: bit(tier.Disk)}},
			entries: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s engineMaps
			ep := &endpoint{}
			other := &endpoint{}
			s.store(other, 1, 1, tier.GPU) // another endpoint's entry: counted, never touched
			for _, st := range tc.steps {
				switch st.op {
				case "store":
					s.store(ep, st.h, st.key, st.tier)
				case "remove":
					s.remove(ep, st.h, st.tier)
				case "clear_tier":
					s.clearTier(ep, st.tier)
				case "clear":
					s.clear(ep)
				}
			}
			if diff := cmp.Diff(tc.want, ep.engine, cmp.AllowUnexported(engineEntry{})); diff != "" {
				t.Errorf("map (-want +got):\n%s", diff)
			}
			if s.entries != tc.entries+1 {
				t.Errorf("entries = %d, want %d", s.entries, tc.entries+1)
			}
			if len(other.engine) != 1 {
				t.Errorf("another endpoint's map changed: %v", other.engine)
			}
		})
	}
}

func TestEngineMapStoreReportsReplacedKey(t *testing.T) {
	var s engineMaps
	ep := &endpoint{}
	if old, tiers := s.store(ep, 1, 10, tier.GPU); tiers != 0 {
		t.Fatalf("first store reported a replaced key %#x in tiers %b", old, tiers)
	}
	s.store(ep, 1, 10, tier.CPU)
	old, tiers := s.store(ep, 1, 11, tier.GPU)
	if old != 10 || tiers != bit(tier.GPU)|bit(tier.CPU) {
		t.Errorf("store of a new key = %#x in %b, want 0xa in gpu|cpu", old, tiers)
	}
	if key, ok := s.lookup(ep, 1); !ok || key != 11 {
		t.Errorf("lookup = %#x, %v; want 0xb", key, ok)
	}
}

func TestLargestEndpoint(t *testing.T) {
	var s engineMaps
	mk := func(pod string, n int) *endpoint {
		ep := &endpoint{id: keyspace.Endpoint{Model: "m", Pod: pod}}
		for i := range n {
			s.store(ep, uint64(i), uint64(i), tier.GPU)
		}
		return ep
	}
	eps := map[keyspace.Endpoint]*endpoint{}
	for _, ep := range []*endpoint{mk("a", 2), mk("b", 5), mk("c", 5), mk("d", 0)} {
		eps[ep.id] = ep
	}
	if got := largest(eps); got == nil || got.id.Pod != "b" {
		t.Errorf("largest = %v, want pod b (most entries, first of a tie)", got)
	}
	if got := largest(map[keyspace.Endpoint]*endpoint{{Pod: "d"}: {}}); got != nil {
		t.Errorf("largest of empty maps = %v, want nil", got)
	}
}

// mapBytesPerEntry is the heap the map of one endpoint takes per entry,
// measured after loading n entries.
func mapBytesPerEntry(n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var s engineMaps
	ep := &endpoint{}
	for i := range n {
		h := uint64(i) * 0x9e3779b97f4a7c15
		s.store(ep, h, h^0xff, tier.GPU)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(ep)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestEngineMapMemory bounds the map's memory per entry (BENCHMARKS.md
// has the measured figure): docs/limits.md sizes --max-map-entries by it.
func TestEngineMapMemory(t *testing.T) {
	if got := mapBytesPerEntry(1 << 20); got > maxMapBytesPerEntry {
		t.Errorf("engine map: %.1f bytes per entry, want at most %d", got, maxMapBytesPerEntry)
	}
}

// BenchmarkEngineMapBytes reports the map's heap bytes per entry at 1M
// entries, and the time to store one.
func BenchmarkEngineMapBytes(b *testing.B) {
	perEntry := mapBytesPerEntry(1 << 20)
	var s engineMaps
	ep := &endpoint{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := uint64(i) * 0x9e3779b97f4a7c15
		s.store(ep, h, h, tier.GPU)
		if len(ep.engine) >= 1<<20 {
			s.clear(ep)
		}
	}
	b.ReportMetric(perEntry, "bytes/entry")
}

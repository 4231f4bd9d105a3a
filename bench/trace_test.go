package bench

import (
	"testing"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/tier"
)

// loadTestTrace reads the bundled trace (found from the package
// directory, as the commands find it from a clone).
func loadTestTrace(t testing.TB) []fleetsim.Request {
	t.Helper()
	trace, err := LoadTrace("")
	if err != nil {
		t.Fatal(err)
	}
	return trace
}

func TestTraceEntries(t *testing.T) {
	trace := loadTestTrace(t)
	src, err := NewTraceEntries(trace[:500], 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		n            int
		wantComplete int
	}{
		{name: "part_of_one_copy", n: 1000, wantComplete: 0},
		{name: "several_copies", n: 30000, wantComplete: 30000 / perCopy(src)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(keyspace.Default())
			seen := map[keyspace.Block]bool{}
			cov := src.Each(tc.n, func(ep keyspace.Endpoint, h uint64) bool {
				b := keyspace.Block{Endpoint: ep, Tier: tier.GPU, Hash: h}
				if seen[b] {
					t.Fatalf("entry %+v produced twice", b)
				}
				seen[b] = true
				if err := ix.Put(ep, tier.GPU, h); err != nil {
					t.Fatal(err)
				}
				return true
			})
			if len(seen) != tc.n || ix.Stats().Entries != uint64(tc.n) {
				t.Fatalf("produced %d entries (index holds %d), want %d", len(seen), ix.Stats().Entries, tc.n)
			}
			if cov.Complete != tc.wantComplete {
				t.Fatalf("%d complete copies, want %d", cov.Complete, tc.wantComplete)
			}
			queries := src.Queries(cov)
			if len(queries) == 0 {
				t.Fatal("no queries")
			}
			var sc index.Scratch
			for i, q := range queries {
				ix.Lookup(&sc, Model, q, nil)
				if len(sc.Matches) == 0 || sc.Matches[0].Blocks != len(q) {
					t.Fatalf("query %d (%d blocks) is not held in full: %+v", i, len(q), sc.Matches)
				}
			}
		})
	}
}

// perCopy counts the entries of one whole copy of src's trace: distinct
// (endpoint, hash id) pairs under round-robin routing.
func perCopy(src *TraceEntries) int {
	type pair struct {
		ep int
		id uint64
	}
	seen := map[pair]bool{}
	for i, r := range src.Trace {
		for _, id := range r.HashIDs {
			seen[pair{i % src.Endpoints, id}] = true
		}
	}
	return len(seen)
}

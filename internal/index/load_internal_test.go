package index

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestLoaderRunsSettleSpills builds one model's table on 1 to 8 runs (see
// loadQueue) from a list whose keys crowd just below the runs' borders,
// so clusters run past a run's part of the table, some across a whole
// next part, and compares every slot value, count and duplicate with the
// same list applied put by put, and the table's layout with blockMap's
// rules (checkBlockMap).
func TestLoaderRunsSettleSpills(t *testing.T) {
	seed := testutil.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	defer func(f func(int) int) { loadWorkers = f }(loadWorkers)
	ks := keyspace.Default()
	for _, workers := range []int{1, 2, 3, 5, 8} {
		loadWorkers = func(int) int { return workers }
		for round := range 3 {
			what := fmt.Sprintf("%d runs, round %d", workers, round)
			hashes := crowdedHashes(rng, workers, 1_500+round*1_000)
			var puts [][2]string
			for seq := 0; seq*keyspace.MaxChunkEntries < len(hashes); seq++ {
				es := make([]keyspace.ChunkEntry, 0, keyspace.MaxChunkEntries)
				for _, h := range hashes[seq*keyspace.MaxChunkEntries : min(len(hashes), (seq+1)*keyspace.MaxChunkEntries)] {
					es = append(es, keyspace.ChunkEntry{Key: h})
				}
				ep := keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("p%d", rng.IntN(5))}
				puts = append(puts, [2]string{ks.ChunkKey(ep, tier.All[rng.IntN(tier.Count)], uint64(seq)), string(keyspace.AppendChunkValue(nil, es, false))})
			}
			want, got := New(ks), New(ks)
			ld := got.Loader()
			for _, p := range puts {
				if _, err := want.ApplyPut(p[0], nil, []byte(p[1])); err != nil {
					t.Fatal(err)
				}
				if _, err := ld.ApplyPut(p[0], []byte(p[1])); err != nil {
					t.Fatal(err)
				}
			}
			if err := ld.Finish(); err != nil {
				t.Fatal(err)
			}
			m := &got.tables["m"].blocks
			checkBlockMap(t, m)
			for _, h := range hashes {
				if w, g := holdersOf(want, h), holdersOf(got, h); !slices.Equal(w, g) {
					t.Fatalf("%s: block %x held by %x, want %x", what, h, g, w)
				}
			}
			if diff := gocmp.Diff(want.dups, got.dups); diff != "" {
				t.Fatalf("%s: duplicate holds (-put by put +loaded):\n%s", what, diff)
			}
			for id := range want.eps {
				if w, g := want.eps[id].blocks, got.eps[id].blocks; w != g {
					t.Fatalf("%s: endpoint %d holds %v blocks, want %v", what, id, g, w)
				}
			}
			if want.entries != got.entries || want.tables["m"].blocks.n != m.n {
				t.Fatalf("%s: %d entries in %d slots, want %d in %d", what, got.entries, m.n, want.entries, want.tables["m"].blocks.n)
			}
		}
	}
}

// crowdedHashes returns about n block hashes, some repeated, whose stored
// keys (mix) are spread at random but for a crowd packed just below each
// border between the runs a table of that many keys is cut into on the
// given number of runs (loadQueue); below the first border the crowd is
// several runs' parts long.
func crowdedHashes(rng *rand.Rand, runs, n int) []uint64 {
	var keys []uint64
	for range n {
		keys = append(keys, rng.Uint64())
	}
	nb := 1 << min(bits.Len(uint(n*3/2/loadBucketEntries)), loadMaxBucketBits)
	shift := loadShift(nb)
	for w := 1; w < runs; w++ {
		border := uint64(nb*w/runs) << shift
		crowd := 200
		if w == 1 {
			crowd = 2 * n / runs
		}
		for i := range crowd {
			keys = append(keys, border-1-uint64(i))
		}
	}
	hashes := make([]uint64, 0, len(keys)+n/10)
	for _, k := range keys {
		hashes = append(hashes, unmix(k))
	}
	for range n / 10 {
		hashes = append(hashes, hashes[rng.IntN(len(hashes))])
	}
	rng.Shuffle(len(hashes), func(i, j int) { hashes[i], hashes[j] = hashes[j], hashes[i] })
	return hashes
}

// holdersOf returns model "m"'s slot value for block hash h as its
// members (one for an inline value), each endpoint ID << 3 | tier mask.
func holdersOf(ix *Index, h uint64) []uint32 {
	v := ix.tables["m"].blocks.get(mix(h))
	if v == 0 || v&multiBit == 0 {
		return []uint32{v}
	}
	return slices.Clone(ix.sets.members(v &^ multiBit))
}

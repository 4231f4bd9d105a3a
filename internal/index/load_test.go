package index_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// listPut is one put of a list: a key, its value, and what applying it
// returned.
type listPut struct {
	key   string
	value []byte
}

// randomList returns the puts of a random listed keyspace: endpoint
// records (some malformed), offsets, chunks of both widths over a small
// pool of hashes (so blocks are shared across endpoints and tiers, and a
// key can sit in two chunks of one (endpoint, tier)), empty and malformed
// chunk values, keys that do not parse, and chunks of endpoints without a
// record; in a random order.
func randomList(rng *rand.Rand, ks keyspace.Keyspace, chunks int) []listPut {
	var puts []listPut
	pool := make([]uint64, 1+rng.IntN(3*chunks+1))
	for i := range pool {
		pool[i] = rng.Uint64()
	}
	randEp := func() keyspace.Endpoint {
		return keyspace.Endpoint{Model: testModels[rng.IntN(len(testModels))], Pod: testPods[rng.IntN(len(testPods))], Rank: uint32(rng.IntN(2))}
	}
	for range rng.IntN(8) {
		val, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: 16}).Marshal()
		if rng.IntN(5) == 0 {
			val = []byte("{")
		}
		puts = append(puts, listPut{key: ks.EndpointKey(randEp()), value: val})
	}
	puts = append(puts, listPut{key: ks.OffsetKey(keyspace.Partition{Topic: "t", Partition: 0}), value: []byte("42")})
	for range chunks {
		ep, tr := randEp(), tier.All[rng.IntN(tier.Count)]
		key := ks.ChunkKey(ep, tr, rng.Uint64N(8))
		es := make([]keyspace.ChunkEntry, 1+rng.IntN(keyspace.MaxChunkEntries))
		for i := range es {
			es[i] = keyspace.ChunkEntry{Key: pool[rng.IntN(len(pool))], Engine: rng.Uint64()}
		}
		val := keyspace.AppendChunkValue(nil, es, rng.IntN(2) == 0)
		switch rng.IntN(40) {
		case 0:
			val = val[:len(val)-1] // not whole entries
		case 1:
			val = nil
		case 2:
			key += "/x" // not a chunk key
		}
		puts = append(puts, listPut{key: key, value: val})
	}
	rng.Shuffle(len(puts), func(i, j int) { puts[i], puts[j] = puts[j], puts[i] })
	return puts
}

// TestLoaderMatchesApplyPut builds indexes from seeded random lists twice,
// put by put with ApplyPut and with a Loader (finished once at the end,
// or also halfway in odd rounds), and insists that each put
// returns the same kind and error, and that the two indexes are the same:
// stats, every model's endpoints and counts, and every hash's holders and
// tiers.
func TestLoaderMatchesApplyPut(t *testing.T) {
	seed := testutil.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	ks := keyspace.Default()
	for round := range 60 {
		puts := randomList(rng, ks, []int{0, 1, 5, 50, 400}[round%5])
		want, got := index.New(ks), index.New(ks)
		var wantErrs, gotErrs []string
		errString := func(kind keyspace.Kind, err error) string { return fmt.Sprintf("%v: %v", kind, err) }
		want.Write(7, func() {
			for _, p := range puts {
				wantErrs = append(wantErrs, errString(want.ApplyPut(p.key, nil, p.value)))
			}
		})
		got.Write(7, func() {
			ld := got.Loader()
			for i, p := range puts {
				gotErrs = append(gotErrs, errString(ld.ApplyPut(p.key, p.value)))
				if round%2 == 1 && i == len(puts)/2 {
					// Finish halfway: the rest goes into tables that
					// hold blocks already (loadEach).
					if err := ld.Finish(); err != nil {
						t.Fatalf("round %d: Finish halfway: %v", round, err)
					}
				}
			}
			if err := ld.Finish(); err != nil {
				t.Fatalf("round %d: Finish: %v", round, err)
			}
		})
		if diff := gocmp.Diff(wantErrs, gotErrs); diff != "" {
			t.Fatalf("round %d: per-put results (-ApplyPut +Loader):\n%s", round, diff)
		}
		compareIndexes(t, fmt.Sprintf("round %d", round), want, got, puts)
	}
}

// compareIndexes insists that got holds what want holds (see
// TestLoaderMatchesApplyPut), probing every hash the puts' chunks name.
func compareIndexes(t *testing.T, what string, want, got *index.Index, puts []listPut) {
	t.Helper()
	ignoreSetWords := cmpopts.IgnoreFields(index.Stats{}, "SetWords")
	if diff := gocmp.Diff(want.Stats(), got.Stats(), ignoreSetWords); diff != "" {
		t.Fatalf("%s: Stats (-ApplyPut +Loader):\n%s", what, diff)
	}
	for _, model := range append([]string{""}, testModels...) {
		w, _ := want.ListEndpoints(model)
		g, _ := got.ListEndpoints(model)
		if diff := gocmp.Diff(w, g, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: ListEndpoints(%q) (-ApplyPut +Loader):\n%s", what, model, diff)
		}
	}
	var hashes []uint64
	for _, p := range puts {
		if cv, err := keyspace.ParseChunkValue(p.value); err == nil {
			for i := range cv.Len() {
				hashes = append(hashes, cv.Key(i))
			}
		}
	}
	slices.Sort(hashes)
	hashes = slices.Compact(hashes)
	for _, model := range testModels {
		for _, h := range hashes {
			w := lookupCopy(want, model, []uint64{h}, nil)
			g := lookupCopy(got, model, []uint64{h}, nil)
			if reflect.DeepEqual(w, g) {
				continue // go-cmp for every hash would be most of the test
			}
			if diff := gocmp.Diff(w, g, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("%s: Lookup(%q, %x) (-ApplyPut +Loader):\n%s", what, model, h, diff)
			}
		}
	}
	checkCounts(t, got)
}

// buildTwice builds an index from puts, all well-formed, at revision 1
// twice: want put by put with ApplyPut, got with a Loader.
func buildTwice(t *testing.T, ks keyspace.Keyspace, puts []listPut) (want, got *index.Index) {
	t.Helper()
	want, got = index.New(ks), index.New(ks)
	want.Write(1, func() {
		for _, p := range puts {
			if _, err := want.ApplyPut(p.key, nil, p.value); err != nil {
				t.Fatal(err)
			}
		}
	})
	got.Write(1, func() {
		ld := got.Loader()
		for _, p := range puts {
			if _, err := ld.ApplyPut(p.key, p.value); err != nil {
				t.Fatal(err)
			}
		}
		if err := ld.Finish(); err != nil {
			t.Fatal(err)
		}
	})
	return want, got
}

// TestLoaderThenWatch applies a watched revision on top of a loaded index
// and on top of the same index applied put by put: a loaded table must
// take later inserts and deletes as any other (the arrays it sized and
// filled in one pass keep blockMap's layout).
func TestLoaderThenWatch(t *testing.T) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m", Pod: "p"}
	var entries []keyspace.ChunkEntry
	for i := range 3000 {
		entries = append(entries, keyspace.ChunkEntry{Key: uint64(i) * 0x9e3779b97f4a7c15})
	}
	var puts []listPut
	for seq := 0; seq*64 < len(entries); seq++ {
		es := entries[seq*64 : min(len(entries), (seq+1)*64)]
		puts = append(puts, listPut{key: ks.ChunkKey(ep, tier.GPU, uint64(seq)), value: keyspace.AppendChunkValue(nil, es, false)})
	}
	want, got := buildTwice(t, ks, puts)
	// Delete every other chunk, then add a chunk of new keys.
	var fresh []keyspace.ChunkEntry
	for i := range 64 {
		fresh = append(fresh, keyspace.ChunkEntry{Key: uint64(i+5000) * 0x9e3779b97f4a7c15})
	}
	next := listPut{key: ks.ChunkKey(ep, tier.CPU, 0), value: keyspace.AppendChunkValue(nil, fresh, false)}
	left := len(entries) + len(fresh)
	for i := 0; i < len(puts); i += 2 {
		cv, _ := keyspace.ParseChunkValue(puts[i].value)
		left -= cv.Len()
	}
	for _, ix := range []*index.Index{want, got} {
		ix.Write(2, func() {
			for i := 0; i < len(puts); i += 2 {
				if _, err := ix.ApplyDelete(puts[i].key, puts[i].value); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := ix.ApplyPut(next.key, nil, next.value); err != nil {
				t.Fatal(err)
			}
		})
	}
	compareIndexes(t, "after the watched revision", want, got, append(puts, next))
	if st := got.Stats(); st.Entries != uint64(left) {
		t.Fatalf("the loaded index holds %d entries after the revision", st.Entries)
	}
}

// TestLoaderSortsOnSeveralGoroutines loads a list big enough for Finish to
// sort its buckets on more than one goroutine (at least 2^16 entries of
// one model, held by several endpoints, some blocks shared) and compares
// it with the same list applied put by put.
func TestLoaderSortsOnSeveralGoroutines(t *testing.T) {
	ks := keyspace.Default()
	rng := rand.New(rand.NewPCG(9, 9))
	pool := make([]uint64, 60_000)
	for i := range pool {
		pool[i] = rng.Uint64()
	}
	var puts []listPut
	for seq := range 1200 {
		ep := keyspace.Endpoint{Model: testModels[0], Pod: testPods[seq%4]}
		es := make([]keyspace.ChunkEntry, keyspace.MaxChunkEntries)
		for i := range es {
			es[i] = keyspace.ChunkEntry{Key: pool[rng.IntN(len(pool))]}
		}
		puts = append(puts, listPut{key: ks.ChunkKey(ep, tier.All[seq%2], uint64(seq)), value: keyspace.AppendChunkValue(nil, es, false)})
	}
	want, got := buildTwice(t, ks, puts)
	if n := len(puts) * keyspace.MaxChunkEntries; n < 1<<16 {
		t.Fatalf("the list has %d entries, too few for the parallel sort", n)
	}
	if st := got.Stats(); st.Duplicates == 0 {
		t.Fatal("no key sits in two chunks of one (endpoint, tier): the list does not exercise duplicate holds")
	}
	compareIndexes(t, "the big list", want, got, puts)
}

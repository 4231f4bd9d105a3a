package index_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/index/indextest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// lookupCopy runs Index.Lookup and copies the result out of the scratch.
func lookupCopy(ix *index.Index, model string, hashes []uint64, candidates []keyspace.Endpoint) []index.Match {
	var sc index.Scratch
	ix.Lookup(&sc, model, hashes, candidates)
	if len(sc.Matches) == 0 {
		return nil
	}
	return slices.Clone(sc.Matches)
}

// lookupTokensCopy runs Index.LookupTokens with keys(size) as the keys at
// each block size and copies the result out of the scratch, with the
// endpoints and sizes it left out.
func lookupTokensCopy(ix *index.Index, model string, keys func(int) []uint64, candidates []keyspace.Endpoint) (_ []index.Match, leftOut [2]int) {
	var sc index.Scratch
	ix.LookupTokens(&sc, model, func(dst []uint64, size int) []uint64 { return append(dst, keys(size)...) }, candidates)
	leftOut = [2]int{sc.LeftOut, sc.LeftOutSizes}
	if len(sc.Matches) == 0 {
		return nil, leftOut
	}
	return slices.Clone(sc.Matches), leftOut
}

var (
	testModes  = []keyspace.HashMode{keyspace.HashModeEngine, keyspace.HashModeToken, keyspace.HashModeToken}
	testSizes  = []uint32{0, 4, 8, 16, 32, 64}
	testModels = []string{"meta-llama/Llama-3.1-8B-Instruct", "m2"}
	testPods   = []string{"vllm-0", "team-a/vllm 1@10.0.0.5:8000", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"}
)

func TestIndexRandomAgainstReference(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pool   int // distinct hashes
		pods   int
		ops    int
		putPct int
		// leftOut: some token Lookup must leave sizes out.
		leftOut bool
	}{
		// dense_sharing's many endpoints take more than
		// MaxTokenBlockSizes sizes at times, so its token Lookups leave
		// some out.
		{name: "dense_sharing", pool: 12, pods: len(testPods), ops: 6000, putPct: 60, leftOut: true},
		{name: "sparse", pool: 400, pods: 4, ops: 6000, putPct: 70},
		{name: "churn_to_empty", pool: 30, pods: 6, ops: 4000, putPct: 45},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := testutil.Seed(t)
			rng := rand.New(rand.NewPCG(seed, 7))
			ks := keyspace.Default()
			ix := index.New(ks)
			ref := indextest.NewReference()
			randEp := func() keyspace.Endpoint {
				return keyspace.Endpoint{Model: testModels[rng.IntN(len(testModels))], Pod: testPods[rng.IntN(tc.pods)], Rank: uint32(rng.IntN(2))}
			}
			pool := make([]uint64, tc.pool)
			for i := range pool {
				pool[i] = rng.Uint64()
			}
			tokenMatches, leftOutLookups := 0, 0
			defer func() {
				if tokenMatches == 0 && !t.Failed() {
					t.Error("no token Lookup matched anything: the stream does not exercise LookupTokens")
				}
				if tc.leftOut && leftOutLookups == 0 && !t.Failed() {
					t.Error("no token Lookup left a block size out: the stream does not exercise the limit")
				}
			}()
			chunker := indextest.NewChunker(ks)
			chunker.Size, chunker.MergeBelow = 4+rng.IntN(5), 2
			for op := 0; op < tc.ops; op++ {
				// One batch of block ops, written as its chunk ops in one
				// revision, applied in a random order.
				for range 1 + rng.IntN(6) {
					ep := randEp()
					switch r := rng.IntN(100); {
					case r < 3: // endpoint record churn
						if rng.IntN(2) == 0 {
							m := indextest.Meta{HashMode: testModes[rng.IntN(len(testModes))], BlockSize: testSizes[rng.IntN(len(testSizes))]}
							val, _ := (&keyspace.EndpointRecord{HashMode: m.HashMode, BlockSize: m.BlockSize}).Marshal()
							mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(ks.EndpointKey(ep), nil, val) })
							ref.Records[ep] = true
							ref.Meta[ep] = m
						} else {
							mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyDelete(ks.EndpointKey(ep), nil) })
							delete(ref.Records, ep)
						}
					case r < 4:
						chunker.Drop(ep)
					default:
						tr, h := tier.All[rng.IntN(tier.Count)], pool[rng.IntN(len(pool))]
						if r < tc.putPct {
							chunker.Store(ep, tr, h, h)
						} else {
							chunker.Remove(ep, tr, h)
						}
					}
				}
				ops := chunker.Flush()
				rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
				applyChunkOps(t, ix, int64(op+2), ops)
				chunker.Present(ref)
				if st := ix.Stats(); st.Duplicates != 0 {
					t.Fatalf("op %d: %d duplicate holds after a whole revision", op, st.Duplicates)
				}
				if op%50 != 0 {
					continue
				}
				model := testModels[rng.IntN(len(testModels))]
				hashes := make([]uint64, 1+rng.IntN(8))
				for i := range hashes {
					hashes[i] = pool[rng.IntN(len(pool))]
				}
				var cands []keyspace.Endpoint
				if rng.IntN(3) == 0 {
					cands = []keyspace.Endpoint{}
					for range rng.IntN(4) {
						cands = append(cands, keyspace.Endpoint{Pod: testPods[rng.IntN(tc.pods)], Rank: uint32(rng.IntN(2))})
					}
				}
				want := ref.Lookup(model, hashes, cands)
				if diff := gocmp.Diff(want, lookupCopy(ix, model, hashes, cands), cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("op %d: Lookup(%s, %x, %v) (-want +got):\n%s", op, model, hashes, cands, diff)
				}
				// A token Lookup: each block size has its own keys.
				bySize := map[int][]uint64{}
				keys := func(size int) []uint64 {
					if bySize[size] == nil {
						ks := make([]uint64, 1+rng.IntN(8))
						for i := range ks {
							ks[i] = pool[rng.IntN(len(pool))]
						}
						bySize[size] = ks
					}
					return bySize[size]
				}
				wantTok, wantLeft := ref.LookupTokens(model, keys, cands)
				gotTok, gotLeft := lookupTokensCopy(ix, model, keys, cands)
				if diff := gocmp.Diff(wantTok, gotTok, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("op %d: LookupTokens(%s, %v) (-want +got):\n%s", op, model, cands, diff)
				}
				if wantLeft != gotLeft {
					t.Fatalf("op %d: LookupTokens(%s, %v) left out %v (endpoints, sizes), want %v", op, model, cands, gotLeft, wantLeft)
				}
				if gotLeft[1] > 0 {
					leftOutLookups++
				}
				tokenMatches += len(gotTok)
			}
			checkInvariants(t, ix, ref)
		})
	}
}

// applyChunkOps applies ops as the events of one revision.
func applyChunkOps(t *testing.T, ix *index.Index, rev int64, ops []indextest.ChunkOp) {
	t.Helper()
	var err error
	ix.Write(rev, func() {
		for _, op := range ops {
			var e error
			if op.Value == nil {
				_, e = ix.ApplyDelete(op.Key, op.Prev)
			} else {
				_, e = ix.ApplyPut(op.Key, op.Prev, op.Value)
			}
			err = errors.Join(err, e)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustApply(t *testing.T, ix *index.Index, rev int64, fn func() (keyspace.Kind, error)) {
	t.Helper()
	var err error
	ix.Write(rev, func() { _, err = fn() })
	if err != nil {
		t.Fatal(err)
	}
}

// checkInvariants compares every derived figure with the reference.
func checkInvariants(t *testing.T, ix *index.Index, ref *indextest.Reference) {
	t.Helper()
	ignoreMeta := cmpopts.IgnoreFields(index.EndpointInfo{}, "LastSeen", "BlockSize", "Partition", "HashMode")
	for _, model := range append([]string{""}, testModels...) {
		got, _ := ix.ListEndpoints(model)
		if diff := gocmp.Diff(ref.Endpoints(model), got, cmpopts.EquateEmpty(), ignoreMeta); diff != "" {
			t.Fatalf("ListEndpoints(%q) (-want +got):\n%s", model, diff)
		}
	}
	st := ix.Stats()
	if st.Entries != uint64(len(ref.Present)) {
		t.Fatalf("stats().Entries = %d, reference holds %d", st.Entries, len(ref.Present))
	}
	// Every block of the reference is found with all of its endpoints.
	for b := range ref.Present {
		got := lookupCopy(ix, b.Endpoint.Model, []uint64{b.Hash}, []keyspace.Endpoint{b.Endpoint})
		if len(got) != 1 || got[0].Blocks != 1 {
			t.Fatalf("block %+v not found: %+v", b, got)
		}
	}
	if len(ref.Present) == 0 && len(ref.Records) == 0 && (st.Endpoints != 0 || st.Models != 0 || st.SetWords != 0 || st.Blocks != 0) {
		t.Fatalf("empty reference but index stats %+v", st)
	}
}

func TestIndexMalformedKeys(t *testing.T) {
	ks := keyspace.Default()
	for _, tc := range []struct {
		name    string
		key     string
		value   string
		del     bool
		wantErr error
	}{
		{name: "no_section", key: "/kvindex/v2/whatever/x", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_seq", key: "/kvindex/v2/chunks/m/p/0/gpu/xyz", value: "\x08\x00\x00\x00\x00\x00\x00\x00\x01", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_tier", key: "/kvindex/v2/chunks/m/p/0/hbm/0000000000000001", value: "\x08\x00\x00\x00\x00\x00\x00\x00\x01", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_rank", key: "/kvindex/v2/chunks/m/p/01/gpu/0000000000000001", value: "\x08\x00\x00\x00\x00\x00\x00\x00\x01", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_rank_delete", key: "/kvindex/v2/chunks/m/p/01/gpu/0000000000000001", del: true, wantErr: keyspace.ErrMalformedKey},
		{name: "bad_width", key: ks.ChunkKey(keyspace.Endpoint{Model: "m", Pod: "p"}, tier.GPU, 0), value: "\x07\x00\x00\x00\x00\x00\x00\x01", wantErr: index.ErrMalformedValue},
		{name: "ragged_value", key: ks.ChunkKey(keyspace.Endpoint{Model: "m", Pod: "p"}, tier.GPU, 0), value: "\x08\x00\x00\x01", wantErr: index.ErrMalformedValue},
		{name: "empty_value", key: ks.ChunkKey(keyspace.Endpoint{Model: "m", Pod: "p"}, tier.GPU, 0), value: "", wantErr: index.ErrMalformedValue},
		{name: "v1_block_key", key: "/kvindex/v2/blocks/m/p/0/gpu/0000000000000001", wantErr: keyspace.ErrMalformedKey},
		{name: "v1_block_key_delete", key: "/kvindex/v2/blocks/m/p/0/gpu/0000000000000001", del: true, wantErr: keyspace.ErrMalformedKey},
		{name: "bad_endpoint_key", key: "/kvindex/v2/endpoints/m/p", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_endpoint_value", key: ks.EndpointKey(keyspace.Endpoint{Model: "m", Pod: "p"}), value: "{", wantErr: index.ErrMalformedValue},
		{name: "bad_offset_value", key: ks.OffsetKey(keyspace.Partition{Topic: "t"}), value: "-3", wantErr: index.ErrMalformedValue},
		{name: "owner_ignored", key: ks.OwnerKey(keyspace.Partition{Topic: "t"}), value: "junk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(ks)
			var err error
			ix.Write(1, func() {
				if tc.del {
					_, err = ix.ApplyDelete(tc.key, []byte(tc.value))
				} else {
					_, err = ix.ApplyPut(tc.key, nil, []byte(tc.value))
				}
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			// (A malformed endpoint record still marks its endpoint.)
			if st := ix.Stats(); st.Entries != 0 || (ks.KindOf(tc.key) == keyspace.KindChunk && st.Endpoints != 0) {
				t.Fatalf("a malformed key changed the index: %+v", st)
			}
		})
	}
}

func TestIndexLookupTokens(t *testing.T) {
	ks := keyspace.Default()
	const model = "m"
	ep := func(pod string) keyspace.Endpoint { return keyspace.Endpoint{Model: model, Pod: pod} }
	type rec struct {
		pod  string
		mode keyspace.HashMode
		size uint32
	}
	// keys at size s are s+1, s+2, ...: each block size has keys of its
	// own, as a real prompt keyed at two sizes does.
	keysAt := func(size int) []uint64 { return []uint64{uint64(size) + 1, uint64(size) + 2, uint64(size) + 3} }
	for _, tc := range []struct {
		name    string
		records []rec
		blocks  map[string][]uint64 // pod -> hashes present in gpu
		cands   []string            // nil: every endpoint
		want    []index.Match
		leftOut [2]int // endpoints, sizes
	}{
		{
			name:    "two_block_sizes_keyed_apart",
			records: []rec{{"a", keyspace.HashModeToken, 16}, {"b", keyspace.HashModeToken, 32}},
			blocks:  map[string][]uint64{"a": {17, 18}, "b": {33, 34, 35}},
			want: []index.Match{
				{Endpoint: ep("b"), Blocks: 3, Tiers: []tier.Tier{tier.GPU, tier.GPU, tier.GPU}, BlockSize: 32},
				{Endpoint: ep("a"), Blocks: 2, Tiers: []tier.Tier{tier.GPU, tier.GPU}, BlockSize: 16},
			},
		},
		{
			name:    "keys_of_another_size_do_not_match",
			records: []rec{{"a", keyspace.HashModeToken, 16}},
			blocks:  map[string][]uint64{"a": {33, 34}},
		},
		{
			name:    "engine_mode_and_unknown_size_left_out",
			records: []rec{{"a", keyspace.HashModeEngine, 16}, {"b", keyspace.HashModeToken, 0}, {"c", keyspace.HashModeToken, 16}},
			blocks:  map[string][]uint64{"a": {17}, "b": {17}, "c": {17}, "d": {17}},
			want:    []index.Match{{Endpoint: ep("c"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 16}},
		},
		{
			name:    "candidates_restrict",
			records: []rec{{"a", keyspace.HashModeToken, 16}, {"b", keyspace.HashModeToken, 16}},
			blocks:  map[string][]uint64{"a": {17}, "b": {17, 18}},
			cands:   []string{"a", "zzz"},
			want:    []index.Match{{Endpoint: ep("a"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 16}},
		},
		{
			// a holds the fewest blocks; b and e tie, and four sizes fit.
			name: "five_sizes_keep_the_four_holding_most",
			records: []rec{{"a", keyspace.HashModeToken, 16}, {"b", keyspace.HashModeToken, 32}, {"c", keyspace.HashModeToken, 64},
				{"d", keyspace.HashModeToken, 128}, {"e", keyspace.HashModeToken, 256}},
			blocks: map[string][]uint64{"a": {17}, "b": {33, 34}, "c": {65, 66, 67}, "d": {129, 900, 901, 902}, "e": {257, 258}},
			want: []index.Match{
				{Endpoint: ep("c"), Blocks: 3, Tiers: []tier.Tier{tier.GPU, tier.GPU, tier.GPU}, BlockSize: 64},
				{Endpoint: ep("b"), Blocks: 2, Tiers: []tier.Tier{tier.GPU, tier.GPU}, BlockSize: 32},
				{Endpoint: ep("e"), Blocks: 2, Tiers: []tier.Tier{tier.GPU, tier.GPU}, BlockSize: 256},
				{Endpoint: ep("d"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 128},
			},
			leftOut: [2]int{1, 1},
		},
		{
			name: "five_sizes_tie_keeps_the_smaller",
			records: []rec{{"a", keyspace.HashModeToken, 16}, {"b", keyspace.HashModeToken, 32}, {"c", keyspace.HashModeToken, 64},
				{"d", keyspace.HashModeToken, 128}, {"e", keyspace.HashModeToken, 256}, {"f", keyspace.HashModeToken, 256}},
			blocks: map[string][]uint64{"a": {17}, "b": {33}, "c": {65}, "d": {129}, "e": {257}},
			want: []index.Match{
				{Endpoint: ep("a"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 16},
				{Endpoint: ep("b"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 32},
				{Endpoint: ep("c"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 64},
				{Endpoint: ep("d"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 128},
			},
			leftOut: [2]int{2, 1},
		},
		{
			name: "five_sizes_but_candidates_have_two",
			records: []rec{{"a", keyspace.HashModeToken, 16}, {"b", keyspace.HashModeToken, 32}, {"c", keyspace.HashModeToken, 64},
				{"d", keyspace.HashModeToken, 128}, {"e", keyspace.HashModeToken, 256}},
			blocks: map[string][]uint64{"a": {17}, "e": {257}},
			cands:  []string{"a", "e"},
			want: []index.Match{
				{Endpoint: ep("a"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 16},
				{Endpoint: ep("e"), Blocks: 1, Tiers: []tier.Tier{tier.GPU}, BlockSize: 256},
			},
		},
		{
			name:   "no_record_no_token_lookup",
			blocks: map[string][]uint64{"a": {17}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(ks)
			for _, r := range tc.records {
				val, _ := (&keyspace.EndpointRecord{HashMode: r.mode, BlockSize: r.size}).Marshal()
				mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(ks.EndpointKey(ep(r.pod)), nil, val) })
			}
			for pod, hs := range tc.blocks {
				mustApply(t, ix, 2, func() (keyspace.Kind, error) {
					return ix.ApplyPut(ks.ChunkKey(ep(pod), tier.GPU, 0), nil, chunkValue(hs...))
				})
			}
			var cands []keyspace.Endpoint
			if tc.cands != nil {
				cands = []keyspace.Endpoint{}
				for _, p := range tc.cands {
					cands = append(cands, keyspace.Endpoint{Pod: p})
				}
			}
			got, leftOut := lookupTokensCopy(ix, model, keysAt, cands)
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
			if leftOut != tc.leftOut {
				t.Errorf("left out %v (endpoints, sizes), want %v", leftOut, tc.leftOut)
			}
		})
	}
}

// TestIndexTokenGroupsFollowRecords checks that an endpoint's record
// moving it between hash modes and block sizes, or going away, moves it
// between the groups a token Lookup keys for.
func TestIndexTokenGroupsFollowRecords(t *testing.T) {
	ks := keyspace.Default()
	a := keyspace.Endpoint{Model: "m", Pod: "a"}
	put := func(ix *index.Index, mode keyspace.HashMode, size uint32) {
		val, _ := (&keyspace.EndpointRecord{HashMode: mode, BlockSize: size}).Marshal()
		mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(ks.EndpointKey(a), nil, val) })
	}
	ix := index.New(ks)
	mustApply(t, ix, 1, func() (keyspace.Kind, error) {
		return ix.ApplyPut(ks.ChunkKey(a, tier.CPU, 3), nil, chunkValue(17, 33))
	})
	keys := func(size int) []uint64 { return []uint64{uint64(size) + 1} }
	for i, step := range []struct {
		do   func()
		want uint32 // the block size a matches at, 0 for no match
	}{
		{func() { put(ix, keyspace.HashModeToken, 16) }, 16},
		{func() { put(ix, keyspace.HashModeToken, 32) }, 32},
		{func() { put(ix, keyspace.HashModeEngine, 32) }, 0},
		{func() { put(ix, keyspace.HashModeToken, 16) }, 16},
		{func() { ix.Write(1, func() { _, _ = ix.ApplyPut(ks.EndpointKey(a), nil, []byte("{")) }) }, 0},
		{func() { put(ix, keyspace.HashModeToken, 32) }, 32},
		{func() {
			mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyDelete(ks.EndpointKey(a), nil) })
		}, 0},
	} {
		step.do()
		got, _ := lookupTokensCopy(ix, "m", keys, nil)
		var size uint32
		if len(got) == 1 {
			size = got[0].BlockSize
		}
		if len(got) > 1 || size != step.want {
			t.Fatalf("step %d: matches %+v, want one at block size %d", i, got, step.want)
		}
	}
}

// TestMalformedOffsetDropsTheOffset: a watched offset value that does not
// parse drops the partition's offset, as a list meeting that value keeps
// none, so a barrier is not met by an offset etcd no longer holds.
func TestMalformedOffsetDropsTheOffset(t *testing.T) {
	ks := keyspace.Default()
	p := keyspace.Partition{Topic: "kvindex-events", Partition: 7}
	ix := index.New(ks)
	put := func(rev int64, v string) error {
		var err error
		ix.Write(rev, func() { _, err = ix.ApplyPut(ks.OffsetKey(p), nil, []byte(v)) })
		return err
	}
	if err := put(1, "10"); err != nil {
		t.Fatal(err)
	}
	barrier := []index.PartitionOffset{{Partition: p, Next: 5}}
	if _, _, ok := ix.Lagging(barrier); !ok {
		t.Fatal("offset 10 does not meet a barrier at 5")
	}
	if err := put(2, "bogus"); !errors.Is(err, index.ErrMalformedValue) {
		t.Fatalf("malformed offset put = %v, want ErrMalformedValue", err)
	}
	if rec, applied, ok := ix.Lagging(barrier); ok || applied != -1 || rec.Partition != p {
		t.Fatalf("after a malformed offset: Lagging = %v, %d, %v; want the partition unknown (-1)", rec, applied, ok)
	}
}

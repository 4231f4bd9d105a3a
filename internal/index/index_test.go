package index_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/index/indextest"
	"github.com/kvindex/kvindex/internal/keyspace"
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

var (
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
	}{
		{name: "dense_sharing", pool: 12, pods: len(testPods), ops: 6000, putPct: 60},
		{name: "sparse", pool: 400, pods: 4, ops: 6000, putPct: 70},
		{name: "churn_to_empty", pool: 30, pods: 6, ops: 4000, putPct: 45},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			rng := rand.New(rand.NewPCG(seed, 7))
			defer func() {
				if t.Failed() {
					t.Logf("seed %d", seed)
				}
			}()
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
			for op := 0; op < tc.ops; op++ {
				ep := randEp()
				switch r := rng.IntN(100); {
				case r < 3: // endpoint record churn
					if rng.IntN(2) == 0 {
						val, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16}).Marshal()
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(ks.EndpointKey(ep), val) })
						ref.Records[ep] = true
					} else {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyDelete(ks.EndpointKey(ep)) })
						delete(ref.Records, ep)
					}
				default:
					b := keyspace.Block{Endpoint: ep, Tier: tier.All[rng.IntN(tier.Count)], Hash: pool[rng.IntN(len(pool))]}
					key := ks.BlockKey(b.Endpoint, b.Tier, b.Hash)
					if r < tc.putPct {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(key, nil) })
						ref.Present[b] = true
					} else {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyDelete(key) })
						delete(ref.Present, b)
					}
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
			}
			checkInvariants(t, ix, ref)
		})
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
	ignoreMeta := cmpopts.IgnoreFields(index.EndpointInfo{}, "LastSeen", "BlockSize", "Partition")
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

func TestIndexPresenceNotCounts(t *testing.T) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m", Pod: "p"}
	for _, tc := range []struct {
		name string
		ops  []string // "+gpu:1", "-cpu:1"
		want []index.Match
	}{
		{name: "repeat_put_is_noop", ops: []string{"+gpu:1", "+gpu:1", "-gpu:1"}, want: nil},
		{name: "delete_absent_is_noop", ops: []string{"-gpu:1", "+gpu:1"}, want: []index.Match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.GPU}}}},
		{name: "best_tier_wins", ops: []string{"+disk:1", "+cpu:1"}, want: []index.Match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.CPU}}}},
		{name: "other_tier_survives_removal", ops: []string{"+gpu:1", "+disk:1", "-gpu:1"}, want: []index.Match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.Disk}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(ks)
			for _, op := range tc.ops {
				tr, _ := tier.Parse(op[1:strings.IndexByte(op, ':')])
				key := ks.BlockKey(ep, tr, 1)
				if op[0] == '+' {
					mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyPut(key, nil) })
				} else {
					mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.ApplyDelete(key) })
				}
			}
			if diff := gocmp.Diff(tc.want, lookupCopy(ix, "m", []uint64{1}, nil)); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
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
		{name: "no_section", key: "/kvindex/v1/whatever/x", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_hash", key: "/kvindex/v1/blocks/m/p/0/gpu/xyz", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_tier", key: "/kvindex/v1/blocks/m/p/0/hbm/0000000000000001", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_rank", key: "/kvindex/v1/blocks/m/p/01/gpu/0000000000000001", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_rank_delete", key: "/kvindex/v1/blocks/m/p/01/gpu/0000000000000001", del: true, wantErr: keyspace.ErrMalformedKey},
		{name: "bad_endpoint_key", key: "/kvindex/v1/endpoints/m/p", wantErr: keyspace.ErrMalformedKey},
		{name: "bad_endpoint_value", key: ks.EndpointKey(keyspace.Endpoint{Model: "m", Pod: "p"}), value: "{", wantErr: index.ErrMalformedValue},
		{name: "bad_offset_value", key: ks.OffsetKey(keyspace.Partition{Topic: "t"}), value: "-3", wantErr: index.ErrMalformedValue},
		{name: "owner_ignored", key: ks.OwnerKey(keyspace.Partition{Topic: "t"}), value: "junk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(ks)
			var err error
			ix.Write(1, func() {
				if tc.del {
					_, err = ix.ApplyDelete(tc.key)
				} else {
					_, err = ix.ApplyPut(tc.key, []byte(tc.value))
				}
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if st := ix.Stats(); st.Entries != 0 {
				t.Fatalf("a malformed key changed the index: %+v", st)
			}
		})
	}
}

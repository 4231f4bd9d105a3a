package indexd

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// refModel is the obvious reference for the index: a set of present
// (endpoint, tier, hash) triples, and DESIGN semantics 5 computed naively.
type refModel struct {
	present map[keyspace.Block]bool
	records map[keyspace.Endpoint]bool
	offsets map[keyspace.Partition]int64
}

func newRefModel() *refModel {
	return &refModel{present: map[keyspace.Block]bool{}, records: map[keyspace.Endpoint]bool{}, offsets: map[keyspace.Partition]int64{}}
}

func (r *refModel) lookup(model string, hashes []uint64, candidates []keyspace.Endpoint) []match {
	eps := map[keyspace.Endpoint]bool{}
	for b := range r.present {
		if b.Endpoint.Model == model {
			eps[b.Endpoint] = true
		}
	}
	if candidates != nil {
		allowed := map[keyspace.Endpoint]bool{}
		for _, c := range candidates {
			c.Model = model
			allowed[c] = true
		}
		for ep := range eps {
			if !allowed[ep] {
				delete(eps, ep)
			}
		}
	}
	var out []match
	for ep := range eps {
		var ts []tier.Tier
		for _, h := range hashes {
			best := tier.Unknown
			for _, t := range tier.All {
				if r.present[keyspace.Block{Endpoint: ep, Tier: t, Hash: h}] && t.Better(best) {
					best = t
				}
			}
			if best == tier.Unknown {
				break
			}
			ts = append(ts, best)
		}
		if len(ts) > 0 {
			out = append(out, match{Endpoint: ep, Blocks: len(ts), Tiers: ts})
		}
	}
	sortMatches(out)
	return out
}

func (r *refModel) endpoints(model string) []endpointInfo {
	infos := map[keyspace.Endpoint]*endpointInfo{}
	get := func(ep keyspace.Endpoint) *endpointInfo {
		if infos[ep] == nil {
			infos[ep] = &endpointInfo{Endpoint: ep}
		}
		return infos[ep]
	}
	for b := range r.present {
		get(b.Endpoint).Blocks[b.Tier-1]++
	}
	for ep := range r.records {
		get(ep).Record = true
	}
	var out []endpointInfo
	for ep, info := range infos {
		if model == "" || ep.Model == model {
			out = append(out, *info)
		}
	}
	slices.SortFunc(out, func(a, b endpointInfo) int { return compareEndpoints(a.Endpoint, b.Endpoint) })
	return out
}

func sortMatches(ms []match) {
	slices.SortFunc(ms, func(a, b match) int {
		if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
			return c
		}
		if c := strings.Compare(a.Endpoint.Pod, b.Endpoint.Pod); c != 0 {
			return c
		}
		return cmp.Compare(a.Endpoint.Rank, b.Endpoint.Rank)
	})
}

// lookupCopy runs index.Lookup and copies the result out of the scratch.
func lookupCopy(ix *index, model string, hashes []uint64, candidates []keyspace.Endpoint) []match {
	var sc lookupScratch
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
			ix := newIndex(ks)
			ref := newRefModel()
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
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyPut(ks.EndpointKey(ep), val) })
						ref.records[ep] = true
					} else {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyDelete(ks.EndpointKey(ep)) })
						delete(ref.records, ep)
					}
				default:
					b := keyspace.Block{Endpoint: ep, Tier: tier.All[rng.IntN(tier.Count)], Hash: pool[rng.IntN(len(pool))]}
					key := ks.BlockKey(b.Endpoint, b.Tier, b.Hash)
					if r < tc.putPct {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyPut(key, nil) })
						ref.present[b] = true
					} else {
						mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyDelete(key) })
						delete(ref.present, b)
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
				want := ref.lookup(model, hashes, cands)
				if diff := gocmp.Diff(want, lookupCopy(ix, model, hashes, cands), cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("op %d: Lookup(%s, %x, %v) (-want +got):\n%s", op, model, hashes, cands, diff)
				}
			}
			checkInvariants(t, ix, ref)
		})
	}
}

func mustApply(t *testing.T, ix *index, rev int64, fn func() (keyspace.Kind, error)) {
	t.Helper()
	var err error
	ix.write(rev, func() { _, err = fn() })
	if err != nil {
		t.Fatal(err)
	}
}

// checkInvariants compares every derived figure with the reference.
func checkInvariants(t *testing.T, ix *index, ref *refModel) {
	t.Helper()
	ignoreMeta := cmpopts.IgnoreFields(endpointInfo{}, "LastSeen", "BlockSize", "Partition")
	for _, model := range append([]string{""}, testModels...) {
		got, _ := ix.ListEndpoints(model)
		if diff := gocmp.Diff(ref.endpoints(model), got, cmpopts.EquateEmpty(), ignoreMeta); diff != "" {
			t.Fatalf("ListEndpoints(%q) (-want +got):\n%s", model, diff)
		}
	}
	st := ix.stats()
	if st.Entries != uint64(len(ref.present)) {
		t.Fatalf("stats().Entries = %d, reference holds %d", st.Entries, len(ref.present))
	}
	// Every block of the reference is found with all of its endpoints.
	for b := range ref.present {
		got := lookupCopy(ix, b.Endpoint.Model, []uint64{b.Hash}, []keyspace.Endpoint{b.Endpoint})
		if len(got) != 1 || got[0].Blocks != 1 {
			t.Fatalf("block %+v not found: %+v", b, got)
		}
	}
	if len(ref.present) == 0 && len(ref.records) == 0 && (st.Endpoints != 0 || st.Models != 0 || st.SetWords != 0 || st.Blocks != 0) {
		t.Fatalf("empty reference but index stats %+v", st)
	}
}

func TestIndexPresenceNotCounts(t *testing.T) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m", Pod: "p"}
	for _, tc := range []struct {
		name string
		ops  []string // "+gpu:1", "-cpu:1"
		want []match
	}{
		{name: "repeat_put_is_noop", ops: []string{"+gpu:1", "+gpu:1", "-gpu:1"}, want: nil},
		{name: "delete_absent_is_noop", ops: []string{"-gpu:1", "+gpu:1"}, want: []match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.GPU}}}},
		{name: "best_tier_wins", ops: []string{"+disk:1", "+cpu:1"}, want: []match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.CPU}}}},
		{name: "other_tier_survives_removal", ops: []string{"+gpu:1", "+disk:1", "-gpu:1"}, want: []match{{Endpoint: ep, Blocks: 1, Tiers: []tier.Tier{tier.Disk}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(ks)
			for _, op := range tc.ops {
				tr, _ := tier.Parse(op[1:strings.IndexByte(op, ':')])
				key := ks.BlockKey(ep, tr, 1)
				if op[0] == '+' {
					mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyPut(key, nil) })
				} else {
					mustApply(t, ix, 1, func() (keyspace.Kind, error) { return ix.applyDelete(key) })
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
		{name: "bad_endpoint_value", key: ks.EndpointKey(keyspace.Endpoint{Model: "m", Pod: "p"}), value: "{", wantErr: ErrMalformedValue},
		{name: "bad_offset_value", key: ks.OffsetKey(keyspace.Partition{Topic: "t"}), value: "-3", wantErr: ErrMalformedValue},
		{name: "owner_ignored", key: ks.OwnerKey(keyspace.Partition{Topic: "t"}), value: "junk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(ks)
			var err error
			ix.write(1, func() {
				if tc.del {
					_, err = ix.applyDelete(tc.key)
				} else {
					_, err = ix.applyPut(tc.key, []byte(tc.value))
				}
			})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if st := ix.stats(); st.Entries != 0 {
				t.Fatalf("a malformed key changed the index: %+v", st)
			}
		})
	}
}

func TestSetArenaGrowAndShrink(t *testing.T) {
	var a setArena
	v := uint32(0)
	const n = 100
	var err error
	var added bool
	for id := uint32(n); id > 0; id-- {
		if v, added, err = a.add(v, id, tierBit(tier.CPU)); err != nil || !added {
			t.Fatalf("add %d: added %v err %v", id, added, err)
		}
	}
	ms := a.members(v &^ multiBit)
	if len(ms) != n || !slices.IsSortedFunc(ms, func(x, y uint32) int { return cmp.Compare(valueID(x), valueID(y)) }) {
		t.Fatalf("members %v: want %d sorted", ms, n)
	}
	for id := uint32(1); id < n; id++ {
		var removed bool
		if v, removed = a.remove(v, id, tierBit(tier.CPU)); !removed {
			t.Fatalf("remove %d: not removed", id)
		}
	}
	if v != inlineValue(n, tierBit(tier.CPU)) {
		t.Fatalf("after removing all but one, value %#x, want inline endpoint %d", v, n)
	}
	if a.live != 0 {
		t.Fatalf("arena keeps %d live words after the set went inline", a.live)
	}
	// Freed blocks are reused.
	words := len(a.words)
	v2 := uint32(0)
	for id := uint32(1); id <= 60; id++ {
		v2, _, _ = a.add(v2, id, tierBit(tier.GPU))
	}
	if len(a.words) != words {
		t.Fatalf("arena grew from %d to %d words though freed blocks fit", words, len(a.words))
	}
}

func BenchmarkApplyPut(b *testing.B) {
	ks := keyspace.Default()
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = ks.BlockKey(keyspace.Endpoint{Model: "m", Pod: fmt.Sprintf("pod-%d", i%16)}, tier.GPU, uint64(i)*0x9e3779b97f4a7c15)
	}
	ix := newIndex(ks)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := keys[i%len(keys)]
		if i/len(keys)%2 == 0 {
			_, _ = ix.applyPut(key, nil)
		} else {
			_, _ = ix.applyDelete(key)
		}
	}
}

package index_test

import (
	"errors"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// chunkValue is the width-8 chunk value of keys, in order.
func chunkValue(keys ...uint64) []byte {
	es := make([]keyspace.ChunkEntry, len(keys))
	for i, k := range keys {
		es[i] = keyspace.ChunkEntry{Key: k, Engine: k}
	}
	return keyspace.AppendChunkValue(nil, es, false)
}

// chunkEvent is one watched chunk event of the diff tests: a put of next
// over prev (raw values), or a delete of prev.
type chunkEvent struct {
	seq  uint64
	t    tier.Tier
	prev []byte
	next []byte
	del  bool
}

func put(seq uint64, t tier.Tier, prev, next []byte) chunkEvent {
	return chunkEvent{seq: seq, t: t, prev: prev, next: next}
}

func del(seq uint64, t tier.Tier, prev []byte) chunkEvent {
	return chunkEvent{seq: seq, t: t, prev: prev, del: true}
}

// chunkState is what a diff test compares after each revision: the
// endpoint's blocks per tier, the best tier of each probed key hash, and
// the duplicate holds.
type chunkState struct {
	Blocks     [tier.Count]uint64
	Best       map[uint64]tier.Tier
	Duplicates int
	Endpoints  int
}

// TestChunkDiff applies revisions of chunk events and checks the state
// after each: what a chunk rewrite adds and removes, a key moving between
// two chunks of one (endpoint, tier) in one revision in either event
// order, deletes, and a key held by two chunks at once.
func TestChunkDiff(t *testing.T) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: "m", Pod: "team-a/vllm 0", Rank: 1}
	const g, c = tier.GPU, tier.CPU
	v := chunkValue
	best := func(kv ...uint64) map[uint64]tier.Tier { // key, tier, key, tier...
		m := map[uint64]tier.Tier{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = tier.Tier(kv[i+1])
		}
		return m
	}
	gpu, cpu := uint64(g), uint64(c)
	for _, tc := range []struct {
		name string
		revs [][]chunkEvent
		want []chunkState // after each revision
		// wantErr is the error a revision's events return (nil: none).
		wantErr []error
	}{
		{
			name: "add",
			revs: [][]chunkEvent{{put(0, g, nil, v(1, 2, 3))}},
			want: []chunkState{{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1}},
		},
		{
			name: "remove_and_append",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2, 3))},
				{put(0, g, v(1, 2, 3), v(1, 3))},
				{put(0, g, v(1, 3), v(3, 4, 5))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(1, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{3}, Best: best(3, gpu, 4, gpu, 5, gpu), Endpoints: 1},
			},
		},
		{
			name: "delete",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(1, g, nil, v(3))},
				{del(0, g, v(1, 2))},
				{del(1, g, v(3))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{1}, Best: best(3, gpu), Endpoints: 1},
				{Best: best()},
			},
		},
		{
			name: "merge_put_before_delete",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(1, g, nil, v(3))},
				{put(1, g, v(3), v(3, 1, 2)), del(0, g, v(1, 2))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
			},
		},
		{
			name: "merge_delete_before_put",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(1, g, nil, v(3))},
				{del(0, g, v(1, 2)), put(1, g, v(3), v(3, 1, 2))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
			},
		},
		{
			name: "move_into_a_new_chunk_and_remove_one",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2, 3))},
				// The open chunk is full: the move opens chunk 1 and a
				// removal drops 2 on the way.
				{put(1, g, nil, v(1, 3)), del(0, g, v(1, 2, 3))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(1, gpu, 3, gpu), Endpoints: 1},
			},
		},
		{
			name: "duplicate_in_two_chunks",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(1, g, nil, v(2, 3))},
				{del(0, g, v(1, 2))},
				{put(1, g, v(2, 3), v(3))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Duplicates: 1, Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{1}, Best: best(3, gpu), Endpoints: 1},
			},
		},
		{
			name: "duplicate_in_one_chunk_taken_back_as_given",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 1, 2))},
				{put(0, g, v(1, 1, 2), v(1, 2))},
				{del(0, g, v(1, 2))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{2}, Best: best(1, gpu, 2, gpu), Duplicates: 1, Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(1, gpu, 2, gpu), Endpoints: 1},
				{Best: best()},
			},
		},
		{
			name: "tiers_apart",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(0, c, nil, v(1))},
				{del(0, g, v(1, 2))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{2, 1}, Best: best(1, gpu, 2, gpu), Endpoints: 1},
				{Blocks: [3]uint64{0, 1}, Best: best(1, cpu), Endpoints: 1},
			},
		},
		{
			name: "width_changes",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2))},
				{put(0, g, v(1, 2), keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 2, Engine: 20}, {Key: 3, Engine: 30}}, true))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{2}, Best: best(1, gpu, 2, gpu), Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(2, gpu, 3, gpu), Endpoints: 1},
			},
		},
		{
			// A value that does not parse is a chunk holding nothing, as
			// a prev and as a value.
			name: "malformed_value_counts_as_empty",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1, 2)), put(1, g, nil, v(3))},
				{put(0, g, v(1, 2), []byte{8, 1, 2})},
				{put(0, g, []byte{8, 1, 2}, v(4))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{3}, Best: best(1, gpu, 2, gpu, 3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{1}, Best: best(3, gpu), Endpoints: 1},
				{Blocks: [3]uint64{2}, Best: best(3, gpu, 4, gpu), Endpoints: 1},
			},
			wantErr: []error{nil, index.ErrMalformedValue, nil},
		},
		{
			name: "delete_of_unknown_chunk_is_noop",
			revs: [][]chunkEvent{
				{put(0, g, nil, v(1))},
				{del(7, g, v(5, 6)), del(0, c, v(1))},
			},
			want: []chunkState{
				{Blocks: [3]uint64{1}, Best: best(1, gpu), Endpoints: 1},
				{Blocks: [3]uint64{1}, Best: best(1, gpu), Endpoints: 1},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := index.New(ks)
			for r, evs := range tc.revs {
				var err error
				ix.Write(int64(r+1), func() {
					for _, e := range evs {
						key := ks.ChunkKey(ep, e.t, e.seq)
						var ee error
						if e.del {
							_, ee = ix.ApplyDelete(key, e.prev)
						} else {
							_, ee = ix.ApplyPut(key, e.prev, e.next)
						}
						err = errors.Join(err, ee)
					}
				})
				var wantErr error
				if tc.wantErr != nil {
					wantErr = tc.wantErr[r]
				}
				if (err == nil) != (wantErr == nil) || (wantErr != nil && !errors.Is(err, wantErr)) {
					t.Fatalf("revision %d: error %v, want %v", r+1, err, wantErr)
				}
				got := chunkState{Best: map[uint64]tier.Tier{}}
				for h := uint64(1); h <= 9; h++ {
					if ms := lookupCopy(ix, ep.Model, []uint64{h}, nil); len(ms) == 1 {
						got.Best[h] = ms[0].Tiers[0]
					}
				}
				infos, _ := ix.ListEndpoints("")
				if len(infos) == 1 {
					got.Blocks = infos[0].Blocks
				}
				st := ix.Stats()
				got.Duplicates, got.Endpoints = st.Duplicates, st.Endpoints
				if diff := gocmp.Diff(tc.want[r], got, cmpopts.EquateEmpty()); diff != "" {
					t.Fatalf("after revision %d (-want +got):\n%s", r+1, diff)
				}
				checkCounts(t, ix)
			}
		})
	}
}

package ingester

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// chunkOp is one step of a chunk-rule case: a store or removal of keys,
// in order, or a drop of the tier.
type chunkOp struct {
	kind string // "store", "remove", "rekey", "drop"
	keys []uint64
}

func st(keys ...uint64) chunkOp { return chunkOp{kind: "store", keys: keys} }

// rekey is one store record that, as token mode does for a block stored
// again under a new key, first removes key old, then stores keys.
func rekey(old uint64, keys ...uint64) chunkOp {
	return chunkOp{kind: "rekey", keys: append([]uint64{old}, keys...)}
}
func rm(keys ...uint64) chunkOp { return chunkOp{kind: "remove", keys: keys} }

// span is keys from..to, in order.
func span(from, to uint64) []uint64 {
	var out []uint64
	for k := from; k <= to; k++ {
		out = append(out, k)
	}
	return out
}

// chunkStateView renders one tier's chunk state: chunk_next, each chunk's
// keys by sequence number, and the window's writes in order.
type chunkStateView struct {
	Next   uint64
	Chunks map[uint64][]uint64
	Writes []string
}

func viewChunks(ep *endpoint, win *window) chunkStateView {
	tc := &ep.chunks[tier.GPU]
	v := chunkStateView{Next: tc.next, Chunks: map[uint64][]uint64{}}
	entries := 0
	for seq, c := range tc.chunks {
		v.Chunks[seq] = chunkKeys(c)
		entries += len(c.entries)
		for _, e := range c.entries {
			if tc.where[e.Key] != c {
				v.Writes = append(v.Writes, fmt.Sprintf("BUG: key %d of chunk %d not indexed to it", e.Key, seq))
			}
		}
	}
	if entries != tc.blocks() {
		v.Writes = append(v.Writes, fmt.Sprintf("BUG: %d entries, %d indexed", entries, tc.blocks()))
	}
	for _, wr := range win.writes {
		if wr.c == nil {
			v.Writes = append(v.Writes, fmt.Sprintf("del %d", wr.seq))
		} else {
			v.Writes = append(v.Writes, fmt.Sprintf("put %d %v", wr.seq, chunkKeys(wr.c)))
		}
	}
	return v
}

// TestChunkRule: the chunk rule of DESIGN ("The chunk rule (writer)"), op
// by op, with chunks of 4: fill, open a new chunk, the open threshold of a
// record's first new block, big records, no-op stores, removal order, the merge
// rule (and its off switch), tail-first eviction, drops that keep
// chunk_next, and each changed chunk written once per window at its final
// state. Each store op is one record.
func TestChunkRule(t *testing.T) {
	tests := []struct {
		name       string
		openAt     int
		bigRecord  int
		mergeBelow int
		ops        []chunkOp
		want       chunkStateView
	}{
		{
			name: "fill",
			ops:  []chunkOp{st(1, 2, 3, 4)},
			want: chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}}, Writes: []string{"put 0 [1 2 3 4]"}},
		},
		{
			name: "a_full_chunk_opens_the_next",
			ops:  []chunkOp{st(span(1, 9)...)},
			want: chunkStateView{Next: 3, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}, 1: {5, 6, 7, 8}, 2: {9}},
				Writes: []string{"put 0 [1 2 3 4]", "put 1 [5 6 7 8]", "put 2 [9]"}},
		},
		{
			name:   "an_event_starts_a_new_chunk_at_the_open_threshold",
			openAt: 3,
			ops:    []chunkOp{st(1, 2, 3), st(4, 5)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 2, 3}, 1: {4, 5}},
				Writes: []string{"put 0 [1 2 3]", "put 1 [4 5]"}},
		},
		{
			name:   "below_the_open_threshold_an_event_appends",
			openAt: 3,
			ops:    []chunkOp{st(1, 2), st(3, 4)},
			want:   chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}}, Writes: []string{"put 0 [1 2 3 4]"}},
		},
		{
			name:   "an_event_fills_the_chunk_past_the_open_threshold",
			openAt: 3,
			ops:    []chunkOp{st(1), st(2, 3, 4, 5)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}, 1: {5}},
				Writes: []string{"put 0 [1 2 3 4]", "put 1 [5]"}},
		},
		{
			name:   "the_open_threshold_counts_from_the_first_new_block",
			openAt: 3,
			ops:    []chunkOp{st(1, 2, 3), st(2, 4)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 2, 3}, 1: {4}},
				Writes: []string{"put 0 [1 2 3]", "put 1 [4]"}},
		},
		{
			// Chunk 0 left with one entry merges it into the open chunk
			// past the threshold; the event's first new block, 23,
			// still takes the threshold and finds chunk 1 full.
			name:   "a_merge_inside_an_event_leaves_it_the_threshold",
			openAt: 3,
			ops:    []chunkOp{st(13, 14, 10, 11), st(15, 16, 17), rm(10, 11), rekey(13, 23, 18)},
			want: chunkStateView{Next: 3, Chunks: map[uint64][]uint64{1: {15, 16, 17, 14}, 2: {23, 18}},
				Writes: []string{"del 0", "put 1 [15 16 17 14]", "put 2 [23 18]"}},
		},
		{
			name:   "a_merge_is_not_an_event",
			openAt: 3,
			ops:    []chunkOp{st(1, 2, 3, 4), st(5, 6, 7), rm(1, 2, 3)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{1: {5, 6, 7, 4}},
				Writes: []string{"del 0", "put 1 [5 6 7 4]"}},
		},
		{
			name:      "a_big_record_opens_a_chunk_at_the_merge_threshold",
			bigRecord: 2,
			ops:       []chunkOp{st(1, 2), st(3, 4)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 2}, 1: {3, 4}},
				Writes: []string{"put 0 [1 2]", "put 1 [3 4]"}},
		},
		{
			name:      "a_small_record_appends_past_the_merge_threshold",
			bigRecord: 2,
			ops:       []chunkOp{st(1, 2), st(3)},
			want:      chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1, 2, 3}}, Writes: []string{"put 0 [1 2 3]"}},
		},
		{
			name:      "below_the_merge_threshold_a_big_record_appends",
			bigRecord: 2,
			ops:       []chunkOp{st(1), st(2, 3)},
			want:      chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1, 2, 3}}, Writes: []string{"put 0 [1 2 3]"}},
		},
		{
			name: "a_store_of_a_present_key_is_a_no_op",
			ops:  []chunkOp{st(1, 2), st(2, 1, 2)},
			want: chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1, 2}}, Writes: []string{"put 0 [1 2]"}},
		},
		{
			name: "a_removal_keeps_the_others_in_order",
			ops:  []chunkOp{st(1, 2, 3, 4, 5), rm(2)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 3, 4}, 1: {5}}, Writes: []string{"put 0 [1 3 4]", "put 1 [5]"}},
		},
		{
			name: "a_removal_of_an_absent_key_is_a_no_op",
			ops:  []chunkOp{st(1), rm(7)},
			want: chunkStateView{Next: 1, Chunks: map[uint64][]uint64{0: {1}}, Writes: []string{"put 0 [1]"}},
		},
		{
			name: "an_emptied_chunk_is_deleted_and_its_sequence_not_reused",
			ops:  []chunkOp{st(1), rm(1), st(2)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{1: {2}}, Writes: []string{"del 0", "put 1 [2]"}},
		},
		{
			name: "a_sparse_chunk_merges_into_the_open_one",
			ops:  []chunkOp{st(span(1, 6)...), rm(1, 2, 3)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{1: {5, 6, 4}}, Writes: []string{"del 0", "put 1 [5 6 4]"}},
		},
		{
			name:       "a_merge_fills_the_open_chunk_then_opens_one",
			mergeBelow: 3,
			ops:        []chunkOp{st(span(1, 7)...), rm(1, 2)},
			want: chunkStateView{Next: 3, Chunks: map[uint64][]uint64{1: {5, 6, 7, 3}, 2: {4}},
				Writes: []string{"del 0", "put 1 [5 6 7 3]", "put 2 [4]"}},
		},
		{
			name: "the_open_chunk_never_merges",
			ops:  []chunkOp{st(span(1, 6)...), rm(5)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}, 1: {6}}, Writes: []string{"put 0 [1 2 3 4]", "put 1 [6]"}},
		},
		{
			name:       "merge_below_1_never_merges",
			mergeBelow: 1,
			ops:        []chunkOp{st(span(1, 6)...), rm(1, 2, 3)},
			want:       chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {4}, 1: {5, 6}}, Writes: []string{"put 0 [4]", "put 1 [5 6]"}},
		},
		{
			// vLLM frees a request's blocks last first: the run 5..12
			// loses its tail, its prefix 5 stays; the chunk left with one
			// entry merges into the open chunk.
			name: "tail_first_eviction",
			ops:  []chunkOp{st(span(1, 12)...), st(13), rm(12, 11, 10, 9, 8, 7, 6)},
			want: chunkStateView{Next: 4, Chunks: map[uint64][]uint64{0: {1, 2, 3, 4}, 3: {13, 5}},
				Writes: []string{"put 0 [1 2 3 4]", "del 1", "del 2", "put 3 [13 5]"}},
		},
		{
			name: "a_drop_deletes_every_chunk_and_keeps_chunk_next",
			ops:  []chunkOp{st(span(1, 9)...), {kind: "drop"}, st(10)},
			want: chunkStateView{Next: 4, Chunks: map[uint64][]uint64{3: {10}}, Writes: []string{"del 0", "del 1", "del 2", "put 3 [10]"}},
		},
		{
			name: "a_key_stored_again_after_its_removal_goes_to_the_open_chunk",
			ops:  []chunkOp{st(1, 2, 3, 4, 5), rm(2), st(2)},
			want: chunkStateView{Next: 2, Chunks: map[uint64][]uint64{0: {1, 3, 4}, 1: {5, 2}}, Writes: []string{"put 0 [1 3 4]", "put 1 [5 2]"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rule := chunkRule{size: 4, openAt: tc.openAt, bigRecord: tc.bigRecord, mergeBelow: 2}
			if tc.mergeBelow != 0 {
				rule.mergeBelow = tc.mergeBelow
			}
			ep := newEndpoint(keyspace.Default(), keyspace.Partition{Topic: "t"}, keyspace.Endpoint{Model: "m", Pod: "p"})
			win := newWindow()
			for _, op := range tc.ops {
				switch op.kind {
				case "store", "rekey":
					keys := op.keys
					ep.chunks[tier.GPU].beginRecord(len(op.keys))
					if op.kind == "rekey" {
						removeChunk(rule, ep, tier.GPU, keys[0], win)
						keys = keys[1:]
					}
					for _, k := range keys {
						storeChunk(rule, ep, tier.GPU, k, k, win)
					}
					ep.chunks[tier.GPU].endRecord()
				case "remove":
					for _, k := range op.keys {
						removeChunk(rule, ep, tier.GPU, k, win)
					}
				case "drop":
					dropChunks(ep, tier.GPU, win)
				}
			}
			if diff := cmp.Diff(tc.want, viewChunks(ep, win)); diff != "" {
				t.Errorf("chunk state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChunkRuleIndependentOfWindows: the chunk state and what etcd ends up
// with depend only on the op sequence, not on where windows end: the same
// ops applied in one window, or in windows of one op each, leave the same
// chunks, and the last write of every chunk key is the same. Store records
// of one and of three blocks meet the open threshold.
func TestChunkRuleIndependentOfWindows(t *testing.T) {
	rule := chunkRule{size: 4, openAt: 3, bigRecord: 3, mergeBelow: 2}
	var ops []chunkOp
	for i := uint64(0); i < 40; i++ {
		if i%4 == 3 {
			ops = append(ops, st(1000+3*i, 1001+3*i, 1002+3*i))
		}
		ops = append(ops, st(100+i))
		if i%3 == 2 {
			ops = append(ops, rm(100+i-1))
		}
		if i%5 == 4 {
			ops = append(ops, rm(100+i-4, 100+i-3))
		}
	}
	run := func(every int) (map[uint64][]uint64, map[uint64]string) {
		ep := newEndpoint(keyspace.Default(), keyspace.Partition{Topic: "t"}, keyspace.Endpoint{Model: "m", Pod: "p"})
		win := newWindow()
		etcd := map[uint64]string{}
		flush := func() {
			for _, wr := range win.writes {
				if wr.c == nil {
					delete(etcd, wr.seq)
				} else {
					etcd[wr.seq] = fmt.Sprint(chunkKeys(wr.c))
				}
			}
			win.reset()
		}
		for i, op := range ops {
			if op.kind == "store" {
				ep.chunks[tier.GPU].beginRecord(len(op.keys))
			}
			for _, k := range op.keys {
				if op.kind == "store" {
					storeChunk(rule, ep, tier.GPU, k, k, win)
				} else {
					removeChunk(rule, ep, tier.GPU, k, win)
				}
			}
			ep.chunks[tier.GPU].endRecord()
			if every > 0 && i%every == every-1 {
				flush()
			}
		}
		flush()
		state := map[uint64][]uint64{}
		for seq, c := range ep.chunks[tier.GPU].chunks {
			state[seq] = chunkKeys(c)
		}
		return state, etcd
	}
	oneState, oneEtcd := run(0)
	for _, every := range []int{1, 3, 7} {
		state, etcd := run(every)
		if diff := cmp.Diff(oneState, state); diff != "" {
			t.Errorf("windows of %d ops: state differs from one window (-one +windows):\n%s", every, diff)
		}
		if diff := cmp.Diff(oneEtcd, etcd); diff != "" {
			t.Errorf("windows of %d ops: etcd differs from one window (-one +windows):\n%s", every, diff)
		}
	}
	// etcd holds exactly the state: every chunk, nothing else.
	want := map[uint64]string{}
	for seq, keys := range oneState {
		want[seq] = fmt.Sprint(keys)
	}
	if diff := cmp.Diff(want, oneEtcd); diff != "" {
		t.Errorf("etcd differs from the state (-state +etcd):\n%s", diff)
	}
	if len(oneState) < 3 {
		t.Fatalf("%d chunks left: the ops exercise too little", len(oneState))
	}
}

// TestChunkRuleTokenEngineHash: in token mode an entry carries its block's
// engine hash; a store of a present key under another engine hash takes
// the new one in place (one rewrite), one under the same hash writes
// nothing.
func TestChunkRuleTokenEngineHash(t *testing.T) {
	rule := chunkRule{size: 4, mergeBelow: 2}
	ep := newEndpoint(keyspace.Default(), keyspace.Partition{Topic: "t"}, keyspace.Endpoint{Model: "m", Pod: "p"})
	win := newWindow()
	storeChunk(rule, ep, tier.GPU, 1, 0xa, win)
	storeChunk(rule, ep, tier.GPU, 2, 0xb, win)
	win.reset()
	storeChunk(rule, ep, tier.GPU, 2, 0xb, win)
	if len(win.writes) != 0 {
		t.Errorf("a store of a present key with its engine hash wrote %d chunks", len(win.writes))
	}
	storeChunk(rule, ep, tier.GPU, 1, 0xc, win)
	got := ep.chunks[tier.GPU].chunks[0].entries
	want := []keyspace.ChunkEntry{{Key: 1, Engine: 0xc}, {Key: 2, Engine: 0xb}}
	if !slices.Equal(got, want) || len(win.writes) != 1 {
		t.Errorf("chunk 0 = %v after %d writes, want %v after one", got, len(win.writes), want)
	}
}

package ingester

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestRebuildRefusesSequencePastMax: a chunk key whose sequence is past
// keyspace.MaxChunkSeq (no writer makes one; here ffffffffffffffff beside
// a real chunk 0) is deleted on rebuild and does not raise the next
// sequence. Before, taking it set next to seq+1, which wrapped to 0, and
// the next store's new chunk was written over chunk 0 and its blocks.
func TestRebuildRefusesSequencePastMax(t *testing.T) {
	var logs bytes.Buffer
	a := testApplier(t, &logs)
	a.cfg.ChunkSize, a.cfg.ChunkMergeBelow = 4, 2
	a.cfg.HashMode = keyspace.HashModeEngine
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a.cfg.Clock = clockwork.NewFakeClockAt(now)
	a.rule = a.cfg.chunkRule()
	w := &worker{cfg: a.cfg, p: a.p, log: a.log, m: a.m, ap: *a}
	ks := a.cfg.Keyspace
	id := keyspace.Endpoint{Model: "m", Pod: "a", Rank: 0}
	ep := newEndpoint(ks, a.p, id)
	ep.hashMode = keyspace.HashModeEngine
	st := &rebuildStats{}
	w.rebuildChunk(ep, []byte(ks.ChunkKey(id, tier.GPU, 0)), keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 1}, {Key: 2}}, false), 0, st)
	w.rebuildChunk(ep, []byte(ks.ChunkKey(id, tier.GPU, math.MaxUint64)), keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 9}}, false), 0, st)

	tc := &ep.chunks[tier.GPU]
	if tc.next != 1 {
		t.Fatalf("next sequence %d after the rebuild, want 1", tc.next)
	}
	if _, ok := tc.chunks[0]; !ok || len(tc.chunks) != 1 {
		t.Fatalf("chunks %v, want chunk 0 only", tc.chunks)
	}
	if !slices.Contains(ep.fixes, chunkFix{tier: tier.GPU, seq: math.MaxUint64}) {
		t.Fatalf("fixes %v, want the bogus chunk deleted", ep.fixes)
	}
	if st.Unmapped != 1 {
		t.Fatalf("%d unmapped, want the bogus chunk's 1", st.Unmapped)
	}

	// The next stores fill chunk 0 and open chunk 1; nothing writes chunk 0
	// without blocks 1 and 2.
	w.ap.eps[id] = ep
	ep.cur.mediums = w.ap.mediums
	ep.cur.lastRecord = now
	ep.base = &seqState{lastRecord: now}
	r := batchRecord(t, "m", "a", now, events.Event{Type: events.BlockStored, BlockHashes: []uint64{5, 6, 7, 8, 10}, Medium: "GPU"})
	w.ap.record(ingesttest.KafkaRecord("t", r), false)
	wrote := 0
	for _, wr := range w.ap.win.writes {
		wrote++
		if wr.seq != 0 {
			continue
		}
		var keys []uint64
		if wr.c != nil {
			for _, e := range wr.c.entries {
				keys = append(keys, e.Key)
			}
		}
		if !slices.Contains(keys, 1) || !slices.Contains(keys, 2) {
			t.Fatalf("chunk 0 written as %s, without its blocks 1 and 2", chunkWriteString(wr))
		}
	}
	if wrote == 0 {
		t.Fatal("the stores wrote no chunk")
	}
}

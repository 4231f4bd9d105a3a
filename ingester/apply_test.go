package ingester

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
)

// windowView renders what the apply part left in a window: its chunk
// writes ("put pod tier/seq entries" or "del pod tier/seq"), its drops,
// and the endpoints it knows (those marked with a record change starred).
type windowView struct {
	Writes    []string
	Drops     []string
	Endpoints []string
}

// chunkWriteString renders one chunk write of a window.
func chunkWriteString(wr chunkWrite) string {
	if wr.c == nil {
		return fmt.Sprintf("del %s %s/%d", wr.ep.id.Pod, wr.tier, wr.seq)
	}
	keys := make([]string, len(wr.c.entries))
	for i, e := range wr.c.entries {
		keys[i] = fmt.Sprint(e.Key)
	}
	return fmt.Sprintf("put %s %s/%d %s", wr.ep.id.Pod, wr.tier, wr.seq, strings.Join(keys, ","))
}

func viewWindow(a *applier) windowView {
	var v windowView
	for _, wr := range a.win.writes {
		v.Writes = append(v.Writes, chunkWriteString(wr))
	}
	for _, d := range a.win.drops {
		s := "drop " + d.ep.id.Pod
		if d.deleteRecord {
			s += " with record"
		}
		v.Drops = append(v.Drops, s)
	}
	for _, ep := range a.win.dirty {
		if !ep.gone {
			v.Endpoints = append(v.Endpoints, ep.id.Pod+"*")
		}
	}
	var clean []string
	for id, ep := range a.eps {
		if !ep.dirty {
			clean = append(clean, id.Pod)
		}
	}
	slices.Sort(clean)
	v.Endpoints = append(v.Endpoints, clean...)
	return v
}

// TestApplyToWindow: the apply part turns records into a window's chunk
// writes, drops and record changes with no etcd and no Kafka behind it (its
// metrics and logs aside, it touches only the window and the endpoints).
func TestApplyToWindow(t *testing.T) {
	now := time.Now()
	stored := func(pod string, seq string, hashes ...uint64) refmodel.Record {
		r := batchRecord(t, "m", pod, now, events.Event{Type: events.BlockStored, BlockHashes: hashes, Medium: "GPU"})
		if seq != "" {
			r.Headers["seq"] = seq
		}
		return r
	}
	removed := func(pod string, hashes ...uint64) refmodel.Record {
		return batchRecord(t, "m", pod, now, events.Event{Type: events.BlockRemoved, BlockHashes: hashes, Medium: "GPU"})
	}
	cleared := func(pod string) refmodel.Record {
		return batchRecord(t, "m", pod, now, events.Event{Type: events.AllBlocksCleared})
	}
	control := func(pod, kind string) refmodel.Record {
		return refmodel.Record{Key: pod, Headers: map[string]string{"model": "m", "kind": kind}, Time: now}
	}
	tests := []struct {
		name string
		recs []refmodel.Record
		want windowView
	}{
		{
			name: "stores_and_removes_coalesce",
			recs: []refmodel.Record{stored("a", "", 1, 2), removed("a", 1), stored("b", "", 3)},
			want: windowView{Writes: []string{"put a gpu/0 2", "put b gpu/0 3"}, Endpoints: []string{"a*", "b*"}},
		},
		{
			name: "clear_deletes_earlier_chunks_and_keeps_chunk_next",
			recs: []refmodel.Record{stored("a", "", 1), cleared("a"), stored("a", "", 2)},
			want: windowView{Writes: []string{"del a gpu/0", "put a gpu/1 2"}, Drops: []string{"drop a"}, Endpoints: []string{"a*"}},
		},
		{
			name: "goodbye_forgets_the_endpoint",
			recs: []refmodel.Record{stored("a", "", 1), control("a", "goodbye"), stored("b", "", 2)},
			want: windowView{Writes: []string{"del a gpu/0", "put b gpu/0 2"}, Drops: []string{"drop a with record"}, Endpoints: []string{"b*"}},
		},
		{
			// The new state starts at chunk 0 again: one write of that key.
			name: "a_new_state_after_goodbye",
			recs: []refmodel.Record{stored("a", "", 1), control("a", "goodbye"), stored("a", "", 2)},
			want: windowView{Writes: []string{"put a gpu/0 2"}, Drops: []string{"drop a with record"}, Endpoints: []string{"a*"}},
		},
		{
			name: "two_drops_of_one_endpoint_are_one",
			recs: []refmodel.Record{stored("a", "", 1), control("a", "resync"), cleared("a"), stored("a", "", 2)},
			want: windowView{Writes: []string{"del a gpu/0", "put a gpu/1 2"}, Drops: []string{"drop a"}, Endpoints: []string{"a*"}},
		},
		{
			// The default open threshold is 48 of 64: the second record's
			// first block finds the open chunk at it.
			name: "a_record_at_the_open_threshold_opens_a_chunk",
			recs: []refmodel.Record{stored("a", "", span(1, 48)...), stored("a", "", 49, 50)},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(span(1, 48)), "put a gpu/1 49,50"}, Endpoints: []string{"a*"}},
		},
		{
			name: "below_the_open_threshold_a_small_record_appends",
			recs: []refmodel.Record{stored("a", "", span(1, 47)...), stored("a", "", 48, 49)},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(span(1, 49))}, Endpoints: []string{"a*"}},
		},
		{
			// A big record (8 stores in the tier for chunks of 64) opens a
			// chunk once the open one holds the merge threshold, 16.
			name: "a_big_record_opens_a_chunk_at_the_merge_threshold",
			recs: []refmodel.Record{stored("a", "", span(1, 16)...), stored("a", "", span(17, 24)...)},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(span(1, 16)), "put a gpu/1 " + joinKeys(span(17, 24))}, Endpoints: []string{"a*"}},
		},
		{
			name: "a_record_of_7_stores_is_small",
			recs: []refmodel.Record{stored("a", "", span(1, 16)...), stored("a", "", span(17, 23)...)},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(span(1, 23))}, Endpoints: []string{"a*"}},
		},
		{
			name: "below_the_merge_threshold_a_big_record_appends",
			recs: []refmodel.Record{stored("a", "", span(1, 15)...), stored("a", "", span(16, 23)...)},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(span(1, 23))}, Endpoints: []string{"a*"}},
		},
		{
			// The stores of all a record's events count, in each tier
			// apart: 4 + 4 on the GPU make it big there; the CPU's 1 does
			// not. The one-store record before it is small and appends.
			// Only the record's first new block takes the threshold: its
			// second GPU event appends.
			name: "a_records_stores_count_per_tier_across_its_events",
			recs: []refmodel.Record{
				stored("a", "", span(1, 16)...),
				stored("a", "", 101),
				batchRecord(t, "m", "a", now,
					events.Event{Type: events.BlockStored, BlockHashes: span(17, 20), Medium: "GPU"},
					events.Event{Type: events.BlockStored, BlockHashes: []uint64{102}, Medium: "CPU"},
					events.Event{Type: events.BlockStored, BlockHashes: span(21, 24), Medium: "GPU"}),
			},
			want: windowView{Writes: []string{"put a gpu/0 " + joinKeys(append(span(1, 16), 101)), "put a gpu/1 " + joinKeys(span(17, 24)), "put a cpu/0 102"}, Endpoints: []string{"a*"}},
		},
		{
			name: "a_new_endpoint_needs_no_drop_for_its_first_seq",
			recs: []refmodel.Record{stored("a", "5", 1), stored("a", "6", 2)},
			want: windowView{Writes: []string{"put a gpu/0 1,2"}, Endpoints: []string{"a*"}},
		},
		{
			name: "duplicate_seq_is_skipped",
			recs: []refmodel.Record{stored("a", "5", 1), stored("a", "5", 2)},
			want: windowView{Writes: []string{"put a gpu/0 1"}, Endpoints: []string{"a*"}},
		},
		{
			name: "a_gap_drops",
			recs: []refmodel.Record{stored("a", "5", 1), stored("a", "7", 2)},
			want: windowView{Writes: []string{"del a gpu/0", "put a gpu/1 2"}, Drops: []string{"drop a"}, Endpoints: []string{"a*"}},
		},
		{
			name: "heartbeat_creates_and_resync_of_unknown_does_nothing",
			recs: []refmodel.Record{control("a", "heartbeat"), control("b", "resync")},
			want: windowView{Endpoints: []string{"a*"}},
		},
		{
			name: "bad_records_are_skipped",
			recs: []refmodel.Record{{Key: "a", Headers: map[string]string{"model": ""}, Time: now}, {Key: "a", Headers: map[string]string{"model": "m", "kind": "dance"}, Time: now}},
			want: windowView{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The cases are written for chunks of 64 without a linger
			// (rule 1's open threshold at 48, big records at 8, merge
			// below 16).
			cfg := DefaultConfig()
			cfg.ChunkSize, cfg.ChunkMergeBelow, cfg.WindowLinger = 64, 16, 0
			cfg = cfg.withDefaults()
			cfg.Clock = clockwork.NewFakeClockAt(now)
			// The cases name blocks by engine hash (token mode has
			// tests of its own in token_test.go).
			cfg.HashMode = keyspace.HashModeEngine
			m, err := newMetrics(cfg.Registry)
			if err != nil {
				t.Fatal(err)
			}
			part := keyspace.Partition{Topic: "t", Partition: 0}
			a := &applier{cfg: &cfg, p: part, log: cfg.Logger, m: m, dec: events.NewDecoder(cfg.Mediums),
				rule: cfg.chunkRule(), eps: map[keyspace.Endpoint]*endpoint{}, win: newWindow()}
			for i, r := range tc.recs {
				kr := ingesttest.KafkaRecord("t", r)
				kr.Offset = int64(i)
				a.record(kr, false)
			}
			if diff := cmp.Diff(tc.want, viewWindow(a)); diff != "" {
				t.Errorf("window (-want +got):\n%s", diff)
			}
		})
	}
}

// joinKeys renders keys as chunkWriteString does.
func joinKeys(keys []uint64) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprint(k)
	}
	return strings.Join(out, ",")
}

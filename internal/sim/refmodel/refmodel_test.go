package refmodel

import (
	"bytes"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestFixtures runs every fixture scenario through the model: the oracle
// itself must agree with the published expectations.
func TestFixtures(t *testing.T) {
	all, err := scenario.Glob(filepath.Join("..", "..", "..", "testdata", "fixtures", "scenarios", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		t.Run(s.Name, func(t *testing.T) {
			m := New(Config{HashMode: keyspace.HashMode(s.HashMode)})
			for _, st := range s.Steps {
				switch st.Kind {
				case scenario.KindPublish:
					m.Apply(Record{Key: st.Publish.Key, Headers: st.Publish.Headers, Value: st.Publish.Value})
				case scenario.KindLookup:
					if diffs := scenario.Compare(st.Lookup.Expect, m.Lookup(st.Lookup.Model, st.Lookup.Keys())); diffs != nil {
						t.Errorf("line %d: %v", st.Line, diffs)
					}
				}
			}
		})
	}
}

func batch(t *testing.T, ts float64, rank any, evs ...any) []byte {
	t.Helper()
	b, err := msgpack.Marshal([]any{ts, evs, rank})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func store(hs ...uint64) any {
	return map[string]any{"type": "BlockStored", "block_hashes": hs, "medium": "GPU"}
}

func TestSequenceAndControl(t *testing.T) {
	const model, pod = "m", "p"
	h := func(kv ...string) map[string]string {
		out := map[string]string{"model": model}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	type step struct {
		rec     Record
		outcome string
	}
	tests := []struct {
		name  string
		steps func(t *testing.T) []step
		want  []uint64 // hashes present on (m, p, 0) in gpu
	}{
		{name: "in_order", want: []uint64{1, 2}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "1"), Value: batch(t, 2, 0, store(2))}},
			}
		}},
		{name: "duplicate_skipped", want: []uint64{1}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1, 2))}},
				{rec: Record{Key: pod, Headers: h("seq", "1"), Value: batch(t, 2, 0, map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{2}})}},
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1, 2))}, outcome: SkipDuplicate},
			}
		}},
		{name: "restart_drops", want: []uint64{3}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 5, 0, store(3))}},
			}
		}},
		{name: "gap_drops", want: []uint64{3}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "2"), Value: batch(t, 2, 0, store(3))}},
			}
		}},
		{name: "first_seq_after_seqless_drops", want: []uint64{3}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h(), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "7"), Value: batch(t, 2, 0, store(3))}},
			}
		}},
		{name: "incarnation_change_drops", want: []uint64{3}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0", "incarnation", "a"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "1", "incarnation", "b"), Value: batch(t, 2, 0, store(3))}},
			}
		}},
		{name: "skipped_record_makes_next_a_gap", want: []uint64{3}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("seq", "1"), Value: []byte{0xc1}}, outcome: SkipMalformed},
				{rec: Record{Key: pod, Headers: h("seq", "2"), Value: batch(t, 3, 0, store(3))}},
			}
		}},
		{name: "resync_keeps_sequence", want: []uint64{2}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
				{rec: Record{Key: pod, Headers: h("kind", "resync")}},
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}, outcome: SkipDuplicate},
				{rec: Record{Key: pod, Headers: h("seq", "1"), Value: batch(t, 2, 0, store(2))}},
			}
		}},
		{name: "goodbye_forgets_sequence", want: []uint64{1}, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(9))}},
				{rec: Record{Key: pod, Headers: h("kind", "goodbye", "dp_rank", "0")}},
				{rec: Record{Key: pod, Headers: h("seq", "0"), Value: batch(t, 1, 0, store(1))}},
			}
		}},
		{name: "bad_headers_and_records", want: nil, steps: func(t *testing.T) []step {
			return []step{
				{rec: Record{Key: pod, Headers: map[string]string{}, Value: batch(t, 1, 0, store(1))}, outcome: SkipBadModel},
				{rec: Record{Key: "", Headers: h(), Value: batch(t, 1, 0, store(1))}, outcome: SkipBadKey},
				{rec: Record{Key: pod, Headers: h("kind", "reboot")}, outcome: SkipUnknownKind},
				{rec: Record{Key: pod, Headers: h("dp_rank", "x"), Value: batch(t, 1, 0, store(1))}, outcome: SkipBadDPRank},
				{rec: Record{Key: pod, Headers: h("dp_rank", "1"), Value: batch(t, 1, 0, store(1))}, outcome: SkipRankMismatch},
				{rec: Record{Key: pod, Headers: h("seq", "01"), Value: batch(t, 1, 0, store(1))}, outcome: SkipBadSeq},
				{rec: Record{Key: pod, Headers: h("format", "protobuf"), Value: batch(t, 1, 0, store(1))}, outcome: SkipUnknownFmt},
				{rec: Record{Key: pod, Headers: h()}, outcome: SkipEmptyValue},
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{})
			for i, s := range tc.steps(t) {
				if got := m.Apply(s.rec); got != s.outcome {
					t.Fatalf("step %d: outcome %q, want %q", i, got, s.outcome)
				}
			}
			var got []uint64
			for _, b := range m.Blocks() {
				got = append(got, b.Hash)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("present hashes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLiveness(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := New(Config{LivenessWindow: 30 * time.Second})
	hb := func(pod string, at time.Time) Record {
		return Record{Key: pod, Headers: map[string]string{"model": "m", "kind": "heartbeat"}, Time: at}
	}
	m.Apply(Record{Key: "a", Headers: map[string]string{"model": "m"}, Value: batch(t, 1, 0, store(1)), Time: t0})
	m.Apply(Record{Key: "b", Headers: map[string]string{"model": "m"}, Value: batch(t, 1, 0, store(1)), Time: t0})
	m.Apply(hb("a", t0.Add(20*time.Second)))
	m.Apply(hb("a", t0.Add(40*time.Second)))
	got := m.Endpoints()
	if len(got) != 1 || got[0].Pod != "a" {
		t.Fatalf("endpoints after 40s = %v, want only a (b went silent at 0s)", got)
	}
	m.Expire(t0.Add(71 * time.Second))
	if got := m.Endpoints(); len(got) != 0 {
		t.Fatalf("endpoints after 71s = %v, want none", got)
	}
}

func TestLookupBlocksBestTierAndOrder(t *testing.T) {
	ep := func(pod string, rank uint32) keyspace.Endpoint {
		return keyspace.Endpoint{Model: "m", Pod: pod, Rank: rank}
	}
	blocks := []keyspace.Block{
		{Endpoint: ep("b", 0), Tier: tier.Disk, Hash: 1},
		{Endpoint: ep("b", 0), Tier: tier.CPU, Hash: 1},
		{Endpoint: ep("b", 0), Tier: tier.Disk, Hash: 2},
		{Endpoint: ep("a", 1), Tier: tier.GPU, Hash: 1},
		{Endpoint: ep("a", 1), Tier: tier.GPU, Hash: 3},
		{Endpoint: keyspace.Endpoint{Model: "other", Pod: "a"}, Tier: tier.GPU, Hash: 1},
	}
	got := LookupBlocks(blocks, "m", []uint64{1, 2, 3})
	want := []scenario.Match{
		{Pod: "a", DPRank: 1, Blocks: 1, Tiers: []string{"gpu"}},
		{Pod: "b", Blocks: 2, Tiers: []string{"cpu", "disk"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("LookupBlocks (-want +got):\n%s", diff)
	}
}

// TestGenerateCoversEveryRule checks the generator is deterministic and
// that its streams reach every outcome the model knows.
func TestGenerateCoversEveryRule(t *testing.T) {
	const seed = 7
	a := Generate(GenConfig{Seed: seed, Records: 3000})
	b := Generate(GenConfig{Seed: seed, Records: 3000})
	same := slices.EqualFunc(a, b, func(x, y Record) bool {
		return x.Key == y.Key && bytes.Equal(x.Value, y.Value) && maps.Equal(x.Headers, y.Headers) && x.Time.Equal(y.Time)
	})
	if !same {
		t.Fatalf("seed %d: two streams differ", seed)
	}
	m := New(Config{})
	seen := map[string]int{}
	for _, r := range a {
		seen[m.Apply(r)]++
	}
	var missing []string
	for _, o := range []string{Applied, SkipBadModel, SkipBadKey, SkipUnknownKind, SkipBadDPRank, SkipBadSeq, SkipMalformed, SkipRankMismatch, SkipEmptyValue, SkipDuplicate, SkipBadIncarn} {
		if seen[o] == 0 {
			missing = append(missing, o)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("seed %d: outcomes never produced: %q (seen %v)", seed, missing, seen)
	}
	if len(m.Blocks()) == 0 {
		t.Fatalf("seed %d: nothing present at the end", seed)
	}
	// The v1.1 shapes: map batches, tier clears, every group profile.
	dec := events.NewDecoder(nil)
	shapes := map[string]int{}
	for _, r := range a {
		if len(r.Value) == 0 {
			continue
		}
		if r.Value[0]&0xf0 == 0x80 {
			shapes["map_batch"]++
		}
		bt, err := dec.Decode(r.Value)
		if err != nil {
			continue
		}
		for _, ev := range bt.Events {
			shapes[ev.Type.String()]++
			if ev.GroupIdx > 0 {
				shapes["group>0"]++
			}
		}
	}
	groups := map[[2]int64]int{}
	for _, ep := range m.Endpoints() {
		g, set := m.Group(ep)
		k := [2]int64{g, 0}
		if set {
			k[1] = 1
		}
		groups[k]++
	}
	for _, k := range []string{"map_batch", "TierBlocksCleared", "AllBlocksCleared", "BlockRemoved", "group>0"} {
		if shapes[k] == 0 {
			t.Errorf("seed %d: no %s in the stream (%v)", seed, k, shapes)
		}
	}
	for _, k := range [][2]int64{{0, 0}, {0, 1}, {1, 1}, {3, 1}} {
		if groups[k] == 0 {
			t.Errorf("seed %d: no endpoint left with group %d (set %d) (%v)", seed, k[0], k[1], groups)
		}
	}
	if sk := m.SkippedEvents(); sk["other_group"] == 0 || sk["unknown_medium"] == 0 {
		t.Errorf("seed %d: skipped events %v, want other_group and unknown_medium", seed, sk)
	}
	tiers := map[tier.Tier]bool{}
	for _, bl := range m.Blocks() {
		tiers[bl.Tier] = true
	}
	if len(tiers) != 3 {
		t.Fatalf("seed %d: tiers present %v, want all three", seed, slices.Collect(func(yield func(tier.Tier) bool) {
			for k := range tiers {
				if !yield(k) {
					return
				}
			}
		}))
	}
}

// TestGenerateTailFirst: with TailFirst, many removals of an engine are
// the tail of one of its store events' runs, last block first, and the
// stream stays deterministic and leaves blocks present.
func TestGenerateTailFirst(t *testing.T) {
	const seed = 11
	cfg := GenConfig{Seed: seed, Records: 3000, MaxHashesPerEvent: 16, Universe: 1 << 20, TailFirst: true}
	a, b := Generate(cfg), Generate(cfg)
	if !slices.EqualFunc(a, b, func(x, y Record) bool { return x.Key == y.Key && bytes.Equal(x.Value, y.Value) }) {
		t.Fatalf("seed %d: two streams differ", seed)
	}
	dec := events.NewDecoder(nil)
	// runs holds each pod's store runs by their last hash; a removal is
	// tail-first when it names, in reverse, the end of a run.
	type key struct {
		pod  string
		last uint64
	}
	runs := map[key][]uint64{}
	tail, removals := 0, 0
	for _, r := range a {
		batch, err := dec.Decode(r.Value)
		if err != nil {
			continue
		}
		for _, ev := range batch.Events {
			switch ev.Type {
			case events.BlockStored:
				if n := len(ev.BlockHashes); n > 1 {
					runs[key{r.Key, ev.BlockHashes[n-1]}] = ev.BlockHashes
				}
			case events.BlockRemoved:
				if len(ev.BlockHashes) < 2 {
					continue
				}
				removals++
				run, ok := runs[key{r.Key, ev.BlockHashes[0]}]
				if !ok || len(run) < len(ev.BlockHashes) {
					continue
				}
				reversed := slices.Clone(run[len(run)-len(ev.BlockHashes):])
				slices.Reverse(reversed)
				if slices.Equal(reversed, ev.BlockHashes) {
					tail++
					delete(runs, key{r.Key, ev.BlockHashes[0]})
					if rest := run[:len(run)-len(ev.BlockHashes)]; len(rest) > 0 {
						runs[key{r.Key, rest[len(rest)-1]}] = rest
					}
				}
			}
		}
	}
	t.Logf("%d of %d removals of 2+ blocks are a run's tail, last first", tail, removals)
	// The others: a fifth pick blocks at random, and engines that
	// restarted or said goodbye hold no runs until they store again.
	if removals == 0 || tail*3 < removals {
		t.Errorf("%d of %d removals of 2+ blocks are tail-first, want at least a third", tail, removals)
	}
	m := New(Config{})
	for _, r := range a {
		m.Apply(r)
	}
	if len(m.Blocks()) == 0 {
		t.Errorf("seed %d: nothing present at the end", seed)
	}
}

package refmodel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// GenConfig shapes a random record stream.
type GenConfig struct {
	// Seed makes the stream reproducible; print it when a test fails.
	Seed uint64
	// Records is the stream length.
	Records int
	// Models, Pods and Ranks bound the endpoints: every pod serves one
	// model and has Ranks data-parallel ranks. Defaults 2, 4, 2.
	Models, Pods, Ranks int
	// Universe is how many distinct block hashes each model draws from;
	// small universes make pods share blocks. Default 64.
	Universe int
	// MaxHashesPerEvent bounds the blocks of one event. Default 8.
	MaxHashesPerEvent int
	// Start is the first record time. Default 2026-01-01 UTC.
	Start time.Time
	// TailFirst makes most removals evict as vLLM frees a finished
	// request's blocks: the tail of one stored run (the blocks of one
	// store event), last block first, the run's prefix left behind for a
	// later removal. Off, removals pick stored blocks at random. The
	// writer's chunk merge rule exists for this order (DESIGN "The chunk
	// rule (writer)").
	TailFirst bool
}

func (c *GenConfig) defaults() {
	if c.Models <= 0 {
		c.Models = 2
	}
	if c.Pods <= 0 {
		c.Pods = 4
	}
	if c.Ranks <= 0 {
		c.Ranks = 2
	}
	if c.Universe <= 0 {
		c.Universe = 64
	}
	if c.MaxHashesPerEvent <= 0 {
		c.MaxHashesPerEvent = 8
	}
	if c.Start.IsZero() {
		c.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
}

// genEngine is one simulated engine process behind one endpoint.
type genEngine struct {
	model, pod string
	rank       int
	useSeq     bool
	seq        uint64
	ts         float64
	stored     []uint64
	// storedIdx are the universe indexes of stored, so a store can extend
	// a chain the engine holds (token mode keys only chains whose parent
	// it knows).
	storedIdx []int
	// runs are the hashes of each store event still held, oldest first,
	// for tail-first removals (GenConfig.TailFirst).
	runs [][]uint64
	sent []Record
	// groups are the kv_cache_spec_kind of each KV-cache group (nil: the
	// engine sends no kind).
	groups []any
}

// groupProfiles are the KV-cache group layouts engines are given in turn:
// a plain model with and without spec kinds, a hybrid model whose
// attention group comes after three mamba groups, one with a sliding-window
// group before its attention group, and one with sliding-window groups
// only (it never leaves provisional group 0).
var groupProfiles = [][]any{
	{"full_attention"},
	{nil},
	{"mamba", "mamba", "mamba", "mla_attention"},
	{"sliding_window", "full_attention"},
	{"sliding_window", "sliding_window"},
}

// Generate returns a seeded random record stream exercising every rule of
// docs/semantics.md: stores (chained prefixes, every medium name of the
// default table in several spellings, every hash encoding, both event
// encodings, array and map batches), removals (of stored and unknown
// blocks, some naming only their group), clears and tier clears (both
// encodings, with and without a medium), hybrid endpoints (the group
// profiles above), heartbeats, resyncs, goodbyes, replayed duplicates,
// engine restarts, sequence gaps, endpoints that send no seq, and garbage
// (bad bytes, truncated batches, bad headers, rank mismatches, unknown
// kinds, unknown mediums).
func Generate(cfg GenConfig) []Record {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	models := make([]string, cfg.Models)
	for i := range models {
		models[i] = fmt.Sprintf("org-%d/model %d", i, i)
	}
	var engines []*genEngine
	for p := 0; p < cfg.Pods; p++ {
		pod := fmt.Sprintf("ns/vllm-%d@10.0.0.%d:8000", p, p)
		for r := 0; r < cfg.Ranks; r++ {
			engines = append(engines, &genEngine{
				model:  models[p%cfg.Models],
				pod:    pod,
				rank:   r,
				useSeq: p%3 != 2, // every third pod's producer sends no seq
				ts:     1.7e9 + float64(p),
				groups: groupProfiles[(p+r)%len(groupProfiles)],
			})
		}
	}
	g := &generator{cfg: cfg, rng: rng, now: cfg.Start}
	out := make([]Record, 0, cfg.Records)
	for len(out) < cfg.Records {
		g.now = g.now.Add(time.Duration(rng.IntN(20)+1) * time.Millisecond)
		e := engines[rng.IntN(len(engines))]
		out = append(out, g.next(e))
	}
	return out
}

type generator struct {
	cfg GenConfig
	rng *rand.Rand
	now time.Time
}

func (g *generator) headers(e *genEngine) map[string]string {
	return map[string]string{"model": e.model}
}

func (g *generator) next(e *genEngine) Record {
	rng := g.rng
	switch x := rng.IntN(1000); {
	case x < 40 && len(e.sent) > 0: // replayed duplicate of a recent record
		dup := e.sent[len(e.sent)-1-rng.IntN(min(len(e.sent), 5))]
		dup.Time = g.now
		return dup
	case x < 70: // heartbeat
		h := g.headers(e)
		h["kind"] = "heartbeat"
		h["dp_rank"] = strconv.Itoa(e.rank)
		return Record{Key: e.pod, Headers: h, Time: g.now}
	case x < 80: // resync
		h := g.headers(e)
		h["kind"] = "resync"
		h["dp_rank"] = strconv.Itoa(e.rank)
		return Record{Key: e.pod, Headers: h, Time: g.now}
	case x < 88: // goodbye; the engine's next record starts a new process
		h := g.headers(e)
		h["kind"] = "goodbye"
		h["dp_rank"] = strconv.Itoa(e.rank)
		e.seq, e.stored, e.storedIdx, e.sent, e.runs = 0, nil, nil, nil, nil
		e.ts += 10
		return Record{Key: e.pod, Headers: h, Time: g.now}
	case x < 105: // engine restart: seq back to 0, newer ts, cache empty
		e.seq, e.stored, e.storedIdx, e.runs = 0, nil, nil, nil
		e.ts += 10
	case x < 120: // a gap nobody healed
		e.seq += uint64(2 + rng.IntN(3))
	case x < 150:
		return g.garbage(e)
	}
	return g.batch(e)
}

// batch builds the engine's next batch record and advances its seq.
func (g *generator) batch(e *genEngine) Record {
	rng := g.rng
	e.ts += 0.001 + rng.Float64()/100
	n := 1 + rng.IntN(4)
	arrays := rng.IntN(4) == 0
	evs := make([]any, 0, n)
	for range n {
		evs = append(evs, g.event(e, arrays))
	}
	var rank any = e.rank
	if e.rank == 0 && rng.IntN(2) == 0 {
		rank = nil
	}
	var ts any = e.ts
	if rng.IntN(8) == 0 {
		ts = float32(e.ts)
	}
	h := g.headers(e)
	if rng.IntN(3) == 0 {
		h["dp_rank"] = strconv.Itoa(e.rank)
	}
	if e.useSeq {
		h["seq"] = strconv.FormatUint(e.seq, 10)
		e.seq++
	}
	var batch any = []any{ts, evs, rank}
	switch rng.IntN(6) {
	case 0: // a map batch (vLLM's newest EventBatch), rank omitted when nil
		m := map[string]any{"ts": ts, "events": evs}
		if rank != nil {
			m["data_parallel_rank"] = rank
		}
		batch = m
	case 1: // a map batch with a nil rank and a key from the future
		batch = map[string]any{"ts": ts, "events": evs, "data_parallel_rank": rank, "schema_version": 2}
	}
	r := Record{Key: e.pod, Headers: h, Value: mustMarshal(batch), Time: g.now}
	e.sent = append(e.sent, r)
	if len(e.sent) > 16 {
		e.sent = e.sent[1:]
	}
	return r
}

// mediums are the medium names events carry: every name of the default
// table, some in other spellings (matched case-insensitively).
var mediums = []any{nil, "GPU", "gpu", "DEVICE", "CPU", "cpu", "CPU_PINNED", "CPU_TIER1", "CPU_TIER2", "Disk", "DISK", "NVME", "STORAGE", "EXTERNAL", "remote"}

func (g *generator) hash(model string, i int) uint64 {
	// Distinct per model, stable per (model, i), spread over 64 bits.
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i)*0x9e3779b97f4a7c15+uint64(len(model))*0xbf58476d1ce4e5b9)
	return binary.BigEndian.Uint64(b[:]) ^ uint64(model[len(model)-1])<<56
}

// wireHash encodes h in one of the three hash forms.
func (g *generator) wireHash(h uint64) any {
	switch g.rng.IntN(3) {
	case 0:
		return int64(h) // SGLang's signed form
	case 1:
		d := make([]byte, 32)
		for i := range 24 {
			d[i] = byte(g.rng.IntN(256))
		}
		binary.BigEndian.PutUint64(d[24:], h)
		return d
	}
	return h
}

func (g *generator) event(e *genEngine, arrays bool) any {
	rng := g.rng
	medium := mediums[rng.IntN(len(mediums))]
	group := rng.IntN(len(e.groups))
	if len(e.groups) > 1 && rng.IntN(3) == 0 {
		// Hybrid engines store in every group; lean towards the last
		// (attention, when there is one) so the index has blocks.
		group = len(e.groups) - 1
	}
	switch x := rng.IntN(100); {
	case x < 2:
		if arrays {
			return []any{"AllBlocksCleared"}
		}
		return map[string]any{"type": "AllBlocksCleared"}
	case x < 4: // a tier clear, medium nil (gpu) or named
		if arrays {
			if medium == nil && rng.IntN(2) == 0 {
				return []any{"TierBlocksCleared"}
			}
			return []any{"TierBlocksCleared", medium}
		}
		return map[string]any{"type": "TierBlocksCleared", "medium": medium}
	case x < 35: // removal of stored blocks (or unknown ones)
		k := 1 + rng.IntN(g.cfg.MaxHashesPerEvent)
		hs := make([]any, 0, k)
		if g.cfg.TailFirst && len(e.runs) > 0 && rng.IntN(5) > 0 {
			// The tail of one of the oldest runs, last block first.
			r := rng.IntN(min(len(e.runs), 3))
			run := e.runs[r]
			k = min(k, len(run))
			for i := len(run) - 1; i >= len(run)-k; i-- {
				hs = append(hs, g.wireHash(run[i]))
			}
			if run = run[:len(run)-k]; len(run) == 0 {
				e.runs = append(e.runs[:r], e.runs[r+1:]...)
			} else {
				e.runs[r] = run
			}
			k = 0
		}
		for range k {
			var h uint64
			if len(e.stored) > 0 && rng.IntN(5) > 0 {
				h = e.stored[rng.IntN(len(e.stored))]
			} else {
				h = g.hash(e.model, rng.IntN(g.cfg.Universe))
			}
			hs = append(hs, g.wireHash(h))
		}
		// Removals carry only group_idx (no kind); group 0 is sometimes
		// left out (nil).
		var gi any = group
		if group == 0 && rng.IntN(2) == 0 {
			gi = nil
		}
		if arrays {
			if gi == nil {
				return []any{"BlockRemoved", hs, medium}
			}
			return []any{"BlockRemoved", hs, medium, gi}
		}
		return map[string]any{"type": "BlockRemoved", "block_hashes": hs, "medium": medium, "group_idx": gi}
	case x < 37: // an event the decoder must skip alone
		if rng.IntN(2) == 0 {
			return map[string]any{"type": "BlockStored", "block_hashes": []any{g.hash(e.model, 0)}, "medium": "HBM"}
		}
		return map[string]any{"type": "TierBlocksCleared", "medium": "HBM"}
	}
	// A store of a chained run of blocks: half the time extending a
	// chain the engine stored (its parent known), else anywhere.
	k := 1 + rng.IntN(g.cfg.MaxHashesPerEvent)
	placeholder := medium != nil && medium != "GPU"
	if placeholder && len(e.stored) > 0 && rng.IntN(4) > 0 {
		// An offload copy of blocks the engine holds: token-less, no
		// parent (token mode keys it through the engine hash).
		hs := make([]any, 0, k)
		for range k {
			hs = append(hs, g.wireHash(e.stored[rng.IntN(len(e.stored))]))
		}
		kind := e.groups[group]
		if arrays {
			return []any{"BlockStored", hs, nil, []any{}, 0, nil, medium, nil, nil, group, kind}
		}
		return map[string]any{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": nil, "token_ids": []any{}, "block_size": 0, "medium": medium, "group_idx": group, "kv_cache_spec_kind": kind}
	}
	start := rng.IntN(g.cfg.Universe)
	switch x := rng.IntN(4); {
	case x < 2 && len(e.storedIdx) > 0:
		start = (e.storedIdx[rng.IntN(len(e.storedIdx))] + 1) % g.cfg.Universe
	case x == 2:
		start = 0 // a prompt's first block: no parent
	}
	hs := make([]any, 0, k)
	run := make([]uint64, 0, k)
	for i := range k {
		u := (start + i) % g.cfg.Universe
		h := g.hash(e.model, u)
		e.stored = append(e.stored, h)
		e.storedIdx = append(e.storedIdx, u)
		hs = append(hs, g.wireHash(h))
		run = append(run, h)
	}
	if g.cfg.TailFirst {
		e.runs = append(e.runs, run)
	}
	var parent any
	if start > 0 {
		parent = g.wireHash(g.hash(e.model, start-1))
	}
	tokens := make([]int, 0, 4*k)
	if medium == nil || medium == "GPU" {
		for i := range 4 * k {
			tokens = append(tokens, 1000+i)
		}
	}
	bs := 4
	if len(tokens) == 0 {
		bs = 0 // offload placeholder
	}
	// Extras (token mode keys them; engine-hash mode ignores them): a LoRA
	// name alone, or extra_keys per block (LoRA and salt on block 0,
	// vLLM's (mm_hash, offset) tuple, nil).
	var lora, extra any
	switch rng.IntN(6) {
	case 0:
		lora = "lora-a"
	case 1:
		keys := make([]any, k)
		for i := range keys {
			switch {
			case i == 0:
				keys[i] = []any{"lora-b", "salt-1"}
			case rng.IntN(2) == 0:
				keys[i] = []any{"lora-b", []any{"mm-1", -i}}
			}
		}
		lora, extra = "lora-b", keys
	}
	kind := e.groups[group]
	if arrays {
		if group == 0 && kind == nil {
			return []any{"BlockStored", hs, parent, tokens, bs, nil, medium, lora, extra}
		}
		return []any{"BlockStored", hs, parent, tokens, bs, nil, medium, lora, extra, group, kind}
	}
	return map[string]any{"type": "BlockStored", "block_hashes": hs, "parent_block_hash": parent, "token_ids": tokens, "block_size": bs, "lora_id": nil, "medium": medium, "lora_name": lora, "extra_keys": extra, "group_idx": group, "kv_cache_spec_kind": kind}
}

// garbage returns a record the pipeline must skip whole.
func (g *generator) garbage(e *genEngine) Record {
	h := g.headers(e)
	r := Record{Key: e.pod, Headers: h, Time: g.now}
	switch g.rng.IntN(10) {
	case 0:
		r.Value = []byte("\x00not msgpack\xff")
	case 1: // truncated batch
		v := mustMarshal([]any{e.ts, []any{map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1), uint64(2)}}}, e.rank})
		r.Value = v[:len(v)-3]
	case 2:
		delete(h, "model")
		r.Value = mustMarshal([]any{e.ts, []any{}, e.rank})
	case 3:
		h["kind"] = "reboot"
	case 4:
		h["dp_rank"] = "01"
		r.Value = mustMarshal([]any{e.ts, []any{}, e.rank})
	case 5:
		h["dp_rank"] = strconv.Itoa(e.rank + 1) // disagrees with the batch
		r.Value = mustMarshal([]any{e.ts, []any{[]any{"AllBlocksCleared"}}, e.rank})
	case 6:
		h["seq"] = "-3"
		r.Value = mustMarshal([]any{e.ts, []any{[]any{"AllBlocksCleared"}}, e.rank})
	case 8:
		h["seq"] = "0"
		h["incarnation"] = "bad\xffutf8"
		r.Value = mustMarshal([]any{e.ts, []any{[]any{"AllBlocksCleared"}}, e.rank})
	case 7:
		r.Key = ""
		r.Value = mustMarshal([]any{e.ts, []any{[]any{"AllBlocksCleared"}}, e.rank})
	default: // a batch record with no value
	}
	return r
}

// mustMarshal encodes v with sorted map keys, so a seed always yields the
// same bytes (Go map order would not).
func mustMarshal(v any) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	err := enc.Encode(v)
	b := buf.Bytes()
	if err != nil {
		// Only plain values are marshalled here; failure is a bug in this
		// generator, reported loudly in the test that called it.
		return []byte{0xc1} // msgpack "never used" byte: decodes as malformed
	}
	return b
}

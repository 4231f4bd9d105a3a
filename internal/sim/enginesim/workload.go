package enginesim

import (
	"container/list"
	"math/rand/v2"
	"slices"
)

// WorkloadConfig shapes the event stream a Workload generates. Zero fields
// take the defaults DefaultWorkloadConfig documents.
type WorkloadConfig struct {
	// BlockSize is the tokens per block. Default 16 (vLLM's default).
	BlockSize int
	// SharedPrefixes is how many distinct prompt prefixes (system prompts,
	// few-shot headers) requests draw from. Default 8.
	SharedPrefixes int
	// PrefixBlocks is the maximum length, in blocks, of a shared prefix a
	// request uses. Default 8.
	PrefixBlocks int
	// TailBlocks is the maximum number of request-unique blocks after the
	// prefix. Default 4.
	TailBlocks int
	// Capacity is how many blocks the simulated cache holds; storing past
	// it evicts the least recently used blocks (BlockRemoved). Default 512.
	Capacity int
	// RequestsPerBatch is how many requests' stores (and the evictions they
	// cause) one batch carries. Default 4.
	RequestsPerBatch int
	// ClearEvery makes every ClearEvery-th batch a lone AllBlocksCleared.
	// Default 0: never.
	ClearEvery int
	// Medium is the medium string of every event; "" (the default) encodes
	// nil, which is GPU.
	Medium string
	// StartTS is the first batch's ts. Default 1.7e9.
	StartTS float64
	// TSStep is the ts increment per batch, in seconds. Default 0.01.
	TSStep float64
	// Rank, when HasRank, is every batch's data_parallel_rank.
	Rank uint32
	// HasRank sets the rank on every batch; false sends nil.
	HasRank bool
}

// DefaultWorkloadConfig returns the defaults documented on WorkloadConfig.
func DefaultWorkloadConfig() WorkloadConfig {
	return WorkloadConfig{
		BlockSize: 16, SharedPrefixes: 8, PrefixBlocks: 8, TailBlocks: 4,
		Capacity: 512, RequestsPerBatch: 4, StartTS: 1.7e9, TSStep: 0.01,
	}
}

func (c *WorkloadConfig) fill() {
	d := DefaultWorkloadConfig()
	for _, f := range []struct{ v, d *int }{
		{&c.BlockSize, &d.BlockSize}, {&c.SharedPrefixes, &d.SharedPrefixes},
		{&c.PrefixBlocks, &d.PrefixBlocks}, {&c.TailBlocks, &d.TailBlocks},
		{&c.Capacity, &d.Capacity}, {&c.RequestsPerBatch, &d.RequestsPerBatch},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	if c.StartTS == 0 {
		c.StartTS = d.StartTS
	}
	if c.TSStep == 0 {
		c.TSStep = d.TSStep
	}
}

// Workload generates a deterministic stream of realistic batches, the way a
// prefix-caching engine's events look: requests share prefixes, so only
// their new blocks are stored (chained by parent hash), and a full cache
// evicts its least recently used blocks. It tracks the blocks that are
// resident after every batch, which is what an index fed by the stream must
// show. Not safe for concurrent use.
type Workload struct {
	cfg     WorkloadConfig
	rng     *rand.Rand
	ts      float64
	batches int
	nextID  uint64
	// lru holds resident hashes, least recently used first; at maps a
	// resident hash to its element.
	lru *list.List
	at  map[uint64]*list.Element
}

// NewWorkload returns a workload drawing from seed; the same seed and
// config give the same batches.
func NewWorkload(seed uint64, cfg WorkloadConfig) *Workload {
	cfg.fill()
	return &Workload{
		cfg: cfg,
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		ts:  cfg.StartTS,
		lru: list.New(),
		at:  map[uint64]*list.Element{},
	}
}

// PrefixHashes returns the first n block hashes of shared prefix p (0 <= p
// < SharedPrefixes): what a router looks up for a request with that
// prefix.
func (w *Workload) PrefixHashes(p, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = mix(uint64(p)<<32 | uint64(i) | 1<<63)
	}
	return out
}

// Resident returns the hashes present after the batches generated so far,
// sorted.
func (w *Workload) Resident() []uint64 {
	out := make([]uint64, 0, len(w.at))
	for h := range w.at {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// Next returns the next batch.
func (w *Workload) Next() Batch {
	w.batches++
	b := Batch{TS: w.ts, Rank: w.cfg.Rank, HasRank: w.cfg.HasRank}
	w.ts += w.cfg.TSStep
	if w.cfg.ClearEvery > 0 && w.batches%w.cfg.ClearEvery == 0 {
		w.lru.Init()
		clear(w.at)
		b.Events = []Event{AllBlocksCleared{}}
		return b
	}
	for range w.cfg.RequestsPerBatch {
		b.Events = append(b.Events, w.request()...)
	}
	return b
}

// request simulates one request: touch its resident blocks, store the
// missing ones after the longest resident run, evict past capacity.
func (w *Workload) request() []Event {
	prefix := w.PrefixHashes(w.rng.IntN(w.cfg.SharedPrefixes), 1+w.rng.IntN(w.cfg.PrefixBlocks))
	chain := prefix
	for range w.rng.IntN(w.cfg.TailBlocks + 1) {
		w.nextID++
		chain = append(chain, mix(w.nextID))
	}
	// The engine reuses the longest resident prefix and computes the rest.
	hit := 0
	for hit < len(chain) {
		if _, ok := w.at[chain[hit]]; !ok {
			break
		}
		hit++
	}
	for _, h := range chain[:hit] {
		w.lru.MoveToBack(w.at[h])
	}
	// Store the missing blocks; a block still resident past an evicted one
	// is reused, so the stores come in runs, each chained to the block
	// before it.
	var evs []Event
	for i := hit; i < len(chain); {
		if el, ok := w.at[chain[i]]; ok {
			w.lru.MoveToBack(el)
			i++
			continue
		}
		j := i
		for j < len(chain) && w.at[chain[j]] == nil {
			j++
		}
		st := BlockStored{BlockHashes: slices.Clone(chain[i:j]), BlockSize: w.cfg.BlockSize, Medium: w.cfg.Medium}
		if i > 0 {
			st.ParentHash, st.HasParent = chain[i-1], true
		}
		st.TokenIDs = make([]int64, 0, len(st.BlockHashes)*w.cfg.BlockSize)
		for _, h := range st.BlockHashes {
			for k := range w.cfg.BlockSize {
				st.TokenIDs = append(st.TokenIDs, int64(mix(h+uint64(k))%128000))
			}
			w.at[h] = w.lru.PushBack(h)
		}
		evs = append(evs, st)
		i = j
	}
	if over := w.lru.Len() - w.cfg.Capacity; over > 0 {
		rm := BlockRemoved{Medium: w.cfg.Medium}
		for range over {
			el := w.lru.Front()
			h := el.Value.(uint64)
			w.lru.Remove(el)
			delete(w.at, h)
			rm.BlockHashes = append(rm.BlockHashes, h)
		}
		evs = append(evs, rm)
	}
	return evs
}

// mix is splitmix64's finaliser: distinct inputs give well spread,
// practically distinct 64-bit hashes.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

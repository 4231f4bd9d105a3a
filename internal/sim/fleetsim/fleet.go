package fleetsim

import (
	"container/list"
	"errors"
	"fmt"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/tier"
)

// Config shapes a simulated fleet.
type Config struct {
	// Endpoints is the number of endpoints (pods, rank 0). Default 16.
	Endpoints int
	// GPUBlocks is each endpoint's GPU cache capacity in blocks. Default
	// 4096.
	GPUBlocks int
	// CPUBlocks is each endpoint's CPU tier capacity in blocks; 0 means no
	// CPU tier. Default 16384; set -1 for none.
	CPUBlocks int
	// TokensPerBlock is the token count (and block_size) each GPU
	// BlockStored carries per block, as vLLM sends token_ids. Default 16.
	TokensPerBlock int
	// Salt is mixed into every block hash (BlockHash), so several copies of
	// one trace can share an index without sharing blocks. Default 0.
	Salt uint64
	// PodPrefix names the pods: PodPrefix + two-digit index. Default "sim-".
	PodPrefix string
}

func (c *Config) defaults() {
	if c.Endpoints == 0 {
		c.Endpoints = 16
	}
	if c.GPUBlocks == 0 {
		c.GPUBlocks = 4096
	}
	if c.CPUBlocks == 0 {
		c.CPUBlocks = 16384
	}
	if c.CPUBlocks < 0 {
		c.CPUBlocks = 0
	}
	if c.TokensPerBlock == 0 {
		c.TokensPerBlock = 16
	}
	if c.PodPrefix == "" {
		c.PodPrefix = "sim-"
	}
}

// Fleet is the simulated fleet. Not safe for concurrent use.
type Fleet struct {
	cfg  Config
	eps  []*endpoint
	next int
	// Stats counts what the fleet emitted.
	Stats Stats
}

// Stats counts simulation outcomes.
type Stats struct {
	Requests                 int
	GPUHits, CPUHits, Misses int
	// BlockOps is the number of (block, tier) changes emitted: each hash of
	// each BlockStored or BlockRemoved event.
	BlockOps int
	Events   int
}

type endpoint struct {
	gpu, cpu *lru
}

// New returns a fleet of empty caches. It fails for negative sizes.
func New(cfg Config) (*Fleet, error) {
	cfg.defaults()
	if cfg.Endpoints < 0 || cfg.GPUBlocks < 1 || cfg.TokensPerBlock < 0 {
		return nil, errors.New("fleetsim: Endpoints, GPUBlocks and TokensPerBlock must be positive")
	}
	f := &Fleet{cfg: cfg}
	for range cfg.Endpoints {
		f.eps = append(f.eps, &endpoint{gpu: newLRU(cfg.GPUBlocks), cpu: newLRU(cfg.CPUBlocks)})
	}
	return f, nil
}

// Pod returns the pod name of endpoint i.
func (f *Fleet) Pod(i int) string { return fmt.Sprintf("%s%02d", f.cfg.PodPrefix, i) }

// Endpoints is the number of endpoints.
func (f *Fleet) Endpoints() int { return len(f.eps) }

// Hashes maps a request's hash ids to block hashes under the fleet's salt.
func (f *Fleet) Hashes(req Request) []uint64 {
	out := make([]uint64, len(req.HashIDs))
	for i, id := range req.HashIDs {
		out[i] = BlockHash(f.cfg.Salt, id)
	}
	return out
}

// Serve routes req to the next endpoint round-robin, updates its caches and
// returns the endpoint's index and the KV events its caches emitted, in
// order: a BlockStored per run of blocks newly placed in the GPU (chained by
// parent), a BlockRemoved (GPU) per eviction, a placeholder BlockStored
// (CPU) per offload, a BlockRemoved (CPU) per CPU eviction. Adjacent events
// of one kind are merged, as an engine batches them.
func (f *Fleet) Serve(req Request) (int, []events.Event) {
	i := f.next
	f.next = (f.next + 1) % len(f.eps)
	return i, f.ServeOn(i, req)
}

// ServeOn is Serve on a chosen endpoint.
func (f *Fleet) ServeOn(i int, req Request) []events.Event {
	ep := f.eps[i]
	f.Stats.Requests++
	var b builder
	hashes := f.Hashes(req)
	for j, h := range hashes {
		if ep.gpu.touch(h) {
			f.Stats.GPUHits++
			continue
		}
		if ep.cpu.touch(h) {
			f.Stats.CPUHits++
		} else {
			f.Stats.Misses++
		}
		var parent uint64
		if j > 0 {
			parent = hashes[j-1]
		}
		b.store(h, parent, j > 0, f.cfg.TokensPerBlock, req, j)
		if victim, ok := ep.gpu.add(h); ok {
			// The offload is published before the GPU removal, as vLLM's
			// offloading connector stores a block in the CPU tier before
			// its GPU copy is freed: in token mode the placeholder is keyed
			// through the engine hash's entry, which lives only while the
			// block is present in some tier (DESIGN "Hashing").
			if ep.cpu.cap > 0 && !ep.cpu.touch(victim) {
				b.offload(victim)
				if cv, ok := ep.cpu.add(victim); ok {
					b.remove(cv, "CPU")
				}
			}
			b.remove(victim, "GPU")
		}
	}
	for _, ev := range b.evs {
		f.Stats.BlockOps += len(ev.BlockHashes)
	}
	f.Stats.Events += len(b.evs)
	return b.evs
}

// Tokens returns the token ids of req's prompt as the fleet's engines see
// it: TokensPerBlock ids per hash id (BlockTokens), first block first.
func (f *Fleet) Tokens(req Request) []uint32 {
	out := make([]uint32, 0, len(req.HashIDs)*f.cfg.TokensPerBlock)
	for _, id := range req.HashIDs {
		out = BlockTokens(out, id, f.cfg.TokensPerBlock)
	}
	return out
}

// Keys returns the canonical token keys (client.TokenKeys, DESIGN
// "Hashing") of req's blocks, what a token-mode ingester stores them
// under and a router that keys locally looks up.
func (f *Fleet) Keys(req Request) []uint64 {
	return client.TokenKeys(client.TokenPrompt{TokenIDs: f.Tokens(req)}, f.cfg.TokensPerBlock)
}

// BlockTokens appends the n token ids the fleet's engines store for trace
// block id to dst: a pure function of the id (so a block id has one token
// content everywhere), each id below 150,000, a typical vocabulary size.
func BlockTokens(dst []uint32, id uint64, n int) []uint32 {
	for k := range n {
		dst = append(dst, uint32((id*31+uint64(k))%150000))
	}
	return dst
}

// builder accumulates events, merging adjacent ones of one kind.
type builder struct {
	evs []events.Event
}

func (b *builder) last() *events.Event {
	if len(b.evs) == 0 {
		return nil
	}
	return &b.evs[len(b.evs)-1]
}

func (b *builder) store(h, parent uint64, hasParent bool, tokensPerBlock int, req Request, j int) {
	ids := BlockTokens(make([]uint32, 0, tokensPerBlock), req.HashIDs[j], tokensPerBlock)
	tokens := make([]int64, len(ids))
	for k, id := range ids {
		tokens[k] = int64(id)
	}
	if l := b.last(); l != nil && l.Type == events.BlockStored && l.Medium == "GPU" && hasParent && l.BlockHashes[len(l.BlockHashes)-1] == parent {
		l.BlockHashes = append(l.BlockHashes, h)
		l.TokenIDs = append(l.TokenIDs, tokens...)
		return
	}
	b.evs = append(b.evs, events.Event{
		Type: events.BlockStored, Index: len(b.evs), BlockHashes: []uint64{h}, ParentHash: parent, HasParent: hasParent,
		TokenIDs: tokens, BlockSize: uint32(tokensPerBlock), Medium: "GPU", Tier: tier.GPU,
	})
}

func (b *builder) offload(h uint64) {
	if l := b.last(); l != nil && l.Type == events.BlockStored && l.Medium == "CPU" {
		l.BlockHashes = append(l.BlockHashes, h)
		return
	}
	b.evs = append(b.evs, events.Event{Type: events.BlockStored, Index: len(b.evs), BlockHashes: []uint64{h}, Medium: "CPU", Tier: tier.CPU})
}

func (b *builder) remove(h uint64, medium string) {
	t := tier.GPU
	if medium == "CPU" {
		t = tier.CPU
	}
	if l := b.last(); l != nil && l.Type == events.BlockRemoved && l.Medium == medium {
		l.BlockHashes = append(l.BlockHashes, h)
		return
	}
	b.evs = append(b.evs, events.Event{Type: events.BlockRemoved, Index: len(b.evs), BlockHashes: []uint64{h}, Medium: medium, Tier: t})
}

// lru is a fixed-capacity LRU set of block hashes.
type lru struct {
	cap   int
	order *list.List // front = most recent
	items map[uint64]*list.Element
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, order: list.New(), items: map[uint64]*list.Element{}}
}

// touch marks h most recently used and reports whether it was present.
func (l *lru) touch(h uint64) bool {
	e, ok := l.items[h]
	if ok {
		l.order.MoveToFront(e)
	}
	return ok
}

// add inserts h (not present) and returns the evicted block, if any.
func (l *lru) add(h uint64) (uint64, bool) {
	if l.cap == 0 {
		return 0, false
	}
	l.items[h] = l.order.PushFront(h)
	if l.order.Len() <= l.cap {
		return 0, false
	}
	tail := l.order.Back()
	l.order.Remove(tail)
	victim := tail.Value.(uint64)
	delete(l.items, victim)
	return victim, true
}

// Contents returns what endpoint i holds: its GPU and CPU blocks.
func (f *Fleet) Contents(i int) (gpu, cpu []uint64) {
	for e := f.eps[i].gpu.order.Front(); e != nil; e = e.Next() {
		gpu = append(gpu, e.Value.(uint64))
	}
	for e := f.eps[i].cpu.order.Front(); e != nil; e = e.Next() {
		cpu = append(cpu, e.Value.(uint64))
	}
	return gpu, cpu
}

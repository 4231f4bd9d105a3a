package sim

import (
	"container/list"

	"github.com/kvindex/kvindex/internal/events"
)

// lru is a set of block keys in least-recently-used order, bounded to cap
// keys. Front is the most recently used.
type lru struct {
	cap int
	l   *list.List
	m   map[uint64]*list.Element
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, l: list.New(), m: make(map[uint64]*list.Element, capacity)}
}

func (c *lru) has(k uint64) bool { _, ok := c.m[k]; return ok }

// touch makes k the most recently used key, adding it; it does not evict.
func (c *lru) touch(k uint64) {
	if e, ok := c.m[k]; ok {
		c.l.MoveToFront(e)
		return
	}
	c.m[k] = c.l.PushFront(k)
}

// oldest removes and returns the least recently used key.
func (c *lru) oldest() (uint64, bool) {
	e := c.l.Back()
	if e == nil {
		return 0, false
	}
	k := c.l.Remove(e).(uint64)
	delete(c.m, k)
	return k, true
}

func (c *lru) len() int { return len(c.m) }

// Media of the events, as vLLM names them.
const (
	MediumGPU = "GPU"
	MediumCPU = "CPU"
)

// Pod is one simulated vLLM engine in token mode: a GPU prefix cache of
// GPUBlocks blocks in LRU order and, when CPUBlocks > 0, a CPU tier that
// receives the GPU's evictions (vLLM's CPU offloading). Its block hashes
// are its own (seeded per pod, as engines with different PYTHONHASHSEEDs
// hash differently); kvindex keys its blocks by their token ids. A Pod is
// not safe for concurrent use.
type Pod struct {
	gpu, cpu *lru
	seed     uint64
}

// NewPod returns an empty pod with a GPU cache of gpuBlocks blocks
// (at least 1), a CPU tier of cpuBlocks (0: none) and engine-hash seed
// seed.
func NewPod(gpuBlocks, cpuBlocks int, seed uint64) *Pod {
	p := &Pod{gpu: newLRU(max(gpuBlocks, 1)), seed: seed}
	if cpuBlocks > 0 {
		p.cpu = newLRU(cpuBlocks)
	}
	return p
}

// engineHash is the pod's block hash of a block key.
func (p *Pod) engineHash(key uint64) uint64 { return mix(key ^ p.seed) }

// Match returns how many of keys' leading blocks the pod holds, by the
// best tier: gpu blocks on GPU, then cpu more found only on the CPU tier;
// the prefix ends at the first block held nowhere. It changes nothing.
func (p *Pod) Match(keys []uint64) (gpu, cpu int) {
	for _, k := range keys {
		switch {
		case p.gpu.has(k):
			gpu++
		case p.cpu != nil && p.cpu.has(k):
			cpu++
		default:
			return gpu, cpu
		}
	}
	return gpu, cpu
}

// Served is what serving one request did on a pod.
type Served struct {
	// GPUHits and CPUHits are the prompt's leading blocks found on GPU and
	// (after them, or between them) only on the CPU tier, as Match.
	GPUHits, CPUHits int
	// Stored counts the blocks stored on GPU: computed, or loaded back
	// from the CPU tier.
	Stored int
	// Events are the vLLM KV events of the request, in order: the
	// evictions that made room (CPU offload stores of evicted GPU blocks,
	// CPU removals, GPU removals), then the GPU stores with their tokens.
	Events []events.Event
}

// maxStoreBlocks bounds one BlockStored event's blocks (vLLM emits one
// per scheduler step; 16 blocks of 512 tokens is an 8192-token chunked
// prefill).
const maxStoreBlocks = 16

// Serve serves a request of full blocks keys (ids are their block ids,
// for the tokens): it counts the prefix hits, pins every block of the
// request (as vLLM holds a running request's blocks), evicts what makes
// room, stores the blocks not on GPU, then frees the request's blocks
// tail first so that its head is the most recently used (vLLM frees a
// finished request's blocks in reverse, evicting tails first). A request
// of more blocks than the GPU holds stores only what fits.
func (p *Pod) Serve(keys, ids []uint64) Served {
	var s Served
	s.GPUHits, s.CPUHits = p.Match(keys)
	// Pin what is on GPU.
	for i := len(keys) - 1; i >= 0; i-- {
		if p.gpu.has(keys[i]) {
			p.gpu.touch(keys[i])
		}
	}
	var missing []int
	for i, k := range keys {
		if !p.gpu.has(k) {
			missing = append(missing, i)
		}
	}
	if need := len(missing) - (p.gpu.cap - p.gpu.len()); need > 0 {
		p.evict(need, &s)
	}
	if free := p.gpu.cap - p.gpu.len(); len(missing) > free {
		// Only the request's own pinned blocks were left to evict (a
		// request longer than the cache): store what fits.
		missing = missing[:free]
	}
	// Stores, in runs of consecutive blocks chained on their parent.
	for j := 0; j < len(missing); {
		start := missing[j]
		ev := events.Event{Type: events.BlockStored, BlockSize: BlockTokens, Medium: MediumGPU}
		if start > 0 {
			ev.ParentHash, ev.HasParent = p.engineHash(keys[start-1]), true
		}
		for n := 0; j < len(missing) && missing[j] == start+n && n < maxStoreBlocks; n, j = n+1, j+1 {
			i := missing[j]
			ev.BlockHashes = append(ev.BlockHashes, p.engineHash(keys[i]))
			var toks [BlockTokens]uint32
			for _, t := range AppendBlockTokens(toks[:0], ids[i], BlockTokens) {
				ev.TokenIDs = append(ev.TokenIDs, int64(t))
			}
			p.gpu.touch(keys[i])
			s.Stored++
		}
		s.Events = append(s.Events, ev)
	}
	// Free tail first: the head ends most recently used.
	for i := len(keys) - 1; i >= 0; i-- {
		if p.gpu.has(keys[i]) {
			p.gpu.touch(keys[i])
		}
	}
	return s
}

// evict removes n blocks from the GPU's cold end, offloading each to the
// CPU tier (which may evict its own cold end), and appends the events.
func (p *Pod) evict(n int, s *Served) {
	var gpuRemoved, cpuStored, cpuRemoved []uint64
	for range n {
		k, ok := p.gpu.oldest()
		if !ok {
			break
		}
		gpuRemoved = append(gpuRemoved, p.engineHash(k))
		if p.cpu == nil {
			continue
		}
		if !p.cpu.has(k) {
			for p.cpu.len() >= p.cpu.cap {
				old, _ := p.cpu.oldest()
				cpuRemoved = append(cpuRemoved, p.engineHash(old))
			}
			cpuStored = append(cpuStored, p.engineHash(k))
		}
		p.cpu.touch(k)
	}
	// The offload stores first: a block's engine-hash entry lives while
	// any tier holds it, so the CPU copy must exist before the GPU
	// removal.
	if len(cpuStored) > 0 {
		s.Events = append(s.Events, events.Event{Type: events.BlockStored, Medium: MediumCPU, BlockHashes: cpuStored})
	}
	if len(cpuRemoved) > 0 {
		s.Events = append(s.Events, events.Event{Type: events.BlockRemoved, Medium: MediumCPU, BlockHashes: cpuRemoved})
	}
	if len(gpuRemoved) > 0 {
		s.Events = append(s.Events, events.Event{Type: events.BlockRemoved, Medium: MediumGPU, BlockHashes: gpuRemoved})
	}
}

// Blocks returns how many blocks the pod holds on GPU and on the CPU tier.
func (p *Pod) Blocks() (gpu, cpu int) {
	if p.cpu != nil {
		cpu = p.cpu.len()
	}
	return p.gpu.len(), cpu
}

package ingester

import (
	"container/list"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
	"github.com/kvindex/kvindex/internal/tier"
)

// chunkCostStream is one eviction order's block ops: per request, the
// events of the endpoint that served it.
type chunkCostStream struct {
	name string
	// batches are (endpoint, events) pairs in order.
	eps  []int
	evs  [][]events.Event
	pods int
}

// lruStream is fleetsim's order: each endpoint's GPU cache is an LRU of
// blocks touched front to back, so a request's prefix is the first of
// its blocks to become least recent and be evicted.
func lruStream(t *testing.T, reqs []fleetsim.Request, pods, gpuBlocks int) chunkCostStream {
	f, err := fleetsim.New(fleetsim.Config{Endpoints: pods, GPUBlocks: gpuBlocks, CPUBlocks: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := chunkCostStream{name: "fleetsim_lru", pods: pods}
	for _, r := range reqs {
		i, evs := f.Serve(r)
		s.eps, s.evs = append(s.eps, i), append(s.evs, evs)
	}
	return s
}

// tailFirstStream is vLLM's order: a block a running request holds is
// never evicted; when the request finishes, its blocks are appended to
// the free queue last block first, and a new block takes the queue's
// front (a prefix-cache hit takes its block off the queue). So a finished
// request's tail leaves first and its prefix, often shared, stays. Each
// request finishes before the next arrives on its endpoint.
func tailFirstStream(reqs []fleetsim.Request, pods, gpuBlocks int) chunkCostStream {
	type pool struct {
		free   *list.List // front: evicted first
		inFree map[uint64]*list.Element
		cached map[uint64]bool
	}
	ps := make([]*pool, pods)
	for i := range ps {
		ps[i] = &pool{free: list.New(), inFree: map[uint64]*list.Element{}, cached: map[uint64]bool{}}
	}
	s := chunkCostStream{name: "vllm_tail_first", pods: pods}
	for n, r := range reqs {
		i := n % pods
		p := ps[i]
		var evs []events.Event
		add := func(typ events.Type, h uint64) {
			if l := len(evs); l > 0 && evs[l-1].Type == typ {
				evs[l-1].BlockHashes = append(evs[l-1].BlockHashes, h)
				return
			}
			evs = append(evs, events.Event{Type: typ, BlockHashes: []uint64{h}, Medium: "GPU", Tier: tier.GPU})
		}
		hashes := make([]uint64, len(r.HashIDs))
		for j, id := range r.HashIDs {
			hashes[j] = fleetsim.BlockHash(0, id)
		}
		held := 0
		for _, h := range hashes {
			if p.cached[h] {
				if e := p.inFree[h]; e != nil {
					p.free.Remove(e)
					delete(p.inFree, h)
				}
				held++
				continue
			}
			if len(p.cached) >= gpuBlocks {
				e := p.free.Front()
				if e == nil {
					break // every block is held by the request: it cannot grow
				}
				v := p.free.Remove(e).(uint64)
				delete(p.inFree, v)
				delete(p.cached, v)
				add(events.BlockRemoved, v)
			}
			p.cached[h] = true
			add(events.BlockStored, h)
			held++
		}
		// The request finishes: its blocks are freed last first.
		for j := held - 1; j >= 0; j-- {
			h := hashes[j]
			if p.cached[h] && p.inFree[h] == nil {
				p.inFree[h] = p.free.PushBack(h)
			}
		}
		s.eps, s.evs = append(s.eps, i), append(s.evs, evs)
	}
	return s
}

// chunkCost is what one stream cost the chunk rule.
type chunkCost struct {
	blockOps, removals int
	// chunkOps counts the chunk puts and deletes written, windowed;
	// putBytes the bytes of the puts' values.
	chunkOps, putBytes int
	// rewritten counts, op by op (no window), the entries a removal made
	// the writer put again: the chunk's survivors, or a merge's moved
	// entries and the chunk they joined.
	rewritten int
	// fillSum and fillN sample the occupancy (blocks per chunk over the
	// chunk size) after every window.
	fillSum float64
	fillN   int
	// present is a check: the blocks the chunks hold at the end.
	present int
}

// countingSink is a window that also counts, op by op, the entries each
// removal rewrites.
type countingSink struct {
	win      *window
	removing bool
	cost     *chunkCost
}

func (s *countingSink) chunkChanged(ep *endpoint, t tier.Tier, seq uint64, c *chunk) {
	if s.removing && c != nil {
		s.cost.rewritten += len(c.entries)
	}
	s.win.chunkChanged(ep, t, seq, c)
}

// runChunkCost applies a stream to the chunk rule with windows of
// windowOps block ops, and checks the chunks hold exactly what a plain
// set of present blocks says.
func runChunkCost(t *testing.T, s chunkCostStream, rule chunkRule, windowOps int) chunkCost {
	var cost chunkCost
	sink := &countingSink{win: newWindow(), cost: &cost}
	eps := make([]*endpoint, s.pods)
	truth := make([]map[uint64]bool, s.pods)
	for i := range eps {
		eps[i] = newEndpoint(keyspace.Default(), keyspace.Partition{Topic: "t"}, keyspace.Endpoint{Model: "m", Pod: fmt.Sprint(i)})
		truth[i] = map[uint64]bool{}
	}
	pending := 0
	flush := func() {
		for _, wr := range sink.win.writes {
			cost.chunkOps++
			if wr.c != nil {
				cost.putBytes += keyspace.ChunkValueLen(len(wr.c.entries), true)
			}
		}
		sink.win.reset()
		pending = 0
		blocks, chunks := 0, 0
		for _, ep := range eps {
			blocks += ep.chunks[tier.GPU].blocks()
			chunks += len(ep.chunks[tier.GPU].chunks)
		}
		if chunks > 0 {
			cost.fillSum += float64(blocks) / float64(chunks*rule.size)
			cost.fillN++
		}
	}
	for k, evs := range s.evs {
		ep := eps[s.eps[k]]
		for _, ev := range evs {
			for _, h := range ev.BlockHashes {
				cost.blockOps++
				pending++
				if ev.Type == events.BlockStored {
					truth[s.eps[k]][h] = true
					storeChunk(rule, ep, tier.GPU, h, h, sink)
				} else {
					cost.removals++
					delete(truth[s.eps[k]], h)
					sink.removing = true
					removeChunk(rule, ep, tier.GPU, h, sink)
					sink.removing = false
				}
			}
		}
		if pending >= windowOps {
			flush()
		}
	}
	flush()
	for i, ep := range eps {
		tc := &ep.chunks[tier.GPU]
		if tc.blocks() != len(truth[i]) {
			t.Fatalf("%s: endpoint %d holds %d blocks in chunks, %d present", s.name, i, tc.blocks(), len(truth[i]))
		}
		for h := range truth[i] {
			if !tc.has(h) {
				t.Fatalf("%s: endpoint %d lost block %x", s.name, i, h)
			}
		}
		cost.present += tc.blocks()
	}
	return cost
}

// TestChunkRuleCost measures the chunk rule on the Mooncake conversation
// trace (16 endpoints, 4,096 GPU blocks each; windows of 1,024 and 16,384
// block ops over the fleet, 64 and 1,024 per endpoint) in two eviction
// orders, fleetsim's LRU and vLLM's tail-first, with the merge rule
// at its default (DefaultChunkMergeBelow of the default chunk size) and
// without it (below 1): chunk ops and bytes put per
// block op, the bytes put beyond each stored block's own 16 per removal
// (the rewrite amplification), the entries a removal rewrites op by op
// before a window coalesces them, and the mean chunk occupancy sampled
// after every window. The figures are in
// BENCHMARKS.md ("Keyspace v2: chunk rule"); run with -v to print them.
// It checks that the chunks always hold exactly the present blocks, and
// that under tail-first eviction the merge rule keeps chunks fuller than
// no merge does.
func TestChunkRuleCost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("replays the Mooncake trace")
	}
	reqs, err := fleetsim.LoadTrace(filepath.Join("..", "testdata", "mooncake", "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	const pods, gpuBlocks = 16, 4096
	streams := []chunkCostStream{lruStream(t, reqs, pods, gpuBlocks), tailFirstStream(reqs, pods, gpuBlocks)}
	fill := map[string]float64{}
	for _, windowOps := range []int{1024, 16 * 1024} {
		for _, s := range streams {
			for _, merge := range []int{DefaultChunkMergeBelow(keyspace.DefaultChunkSize), 1} {
				c := runChunkCost(t, s, chunkRule{size: keyspace.DefaultChunkSize, mergeBelow: merge}, windowOps)
				occupancy := c.fillSum / float64(max(c.fillN, 1))
				fill[fmt.Sprint(windowOps, s.name, merge)] = occupancy
				// Each stored block is put once at least (16 bytes, token
				// mode); what a window puts beyond that is rewriting.
				stores := c.blockOps - c.removals
				excess := float64(c.putBytes-stores*keyspace.ChunkWidthKeyEngine) / float64(c.removals)
				t.Logf("window_ops=%d %s merge_below=%d: block_ops=%d removals=%d chunk_ops/block_op=%.4f put_bytes/block_op=%.1f rewrite_bytes/removal=%.1f entries_rewritten/removal_unwindowed=%.1f occupancy=%.3f present=%d",
					windowOps, s.name, merge, c.blockOps, c.removals, float64(c.chunkOps)/float64(c.blockOps), float64(c.putBytes)/float64(c.blockOps),
					excess, float64(c.rewritten)/float64(c.removals), occupancy, c.present)
				if c.removals == 0 {
					t.Fatalf("%s: no removals: the stream does not evict", s.name)
				}
			}
		}
		if with, without := fill[fmt.Sprint(windowOps, "vllm_tail_first", DefaultChunkMergeBelow(keyspace.DefaultChunkSize))], fill[fmt.Sprint(windowOps, "vllm_tail_first", 1)]; with <= without {
			t.Errorf("windows of %d ops, tail-first eviction: mean occupancy %.3f with the merge rule, %.3f without; want the merge rule fuller", windowOps, with, without)
		}
	}
}

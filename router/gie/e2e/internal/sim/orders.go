package sim

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"
)

// sessionKey groups the requests whose order a jittered arrival keeps:
// those whose first two hash ids agree. The traces name no sessions; a
// conversation's later turns repeat its earlier turns' blocks, so they
// share at least their first two ids (every request of the conversation
// trace shares its first block, a system prompt, so one id would group
// the whole trace). Requests sharing a document start are grouped too,
// which keeps more order than needed, never less. A request of one id
// is in no group.
type sessionKey [2]uint64

// ArrivalOrder returns the requests of arrival order k of reqs (in trace
// order). Order 0 is the trace's own: reqs itself. Order k >= 1 moves
// each request's arrival by a uniform jitter in [-jitter, +jitter]
// (clamped at 0), drawn from a generator seeded by seed and k, then
// delays it to no earlier than the jittered arrival of the previous
// request of its group (sessionKey), and sorts the requests by the new
// arrivals, stably. So within a group the trace's order is kept (turns
// of one conversation never swap), across groups requests interleave
// anew, and every request stays within jitter of its trace time unless
// an earlier turn of its group holds it back. The same (reqs, k, jitter,
// seed) give the same order. The result shares the requests' slices.
func ArrivalOrder(reqs []Request, k int, jitter time.Duration, seed uint64) []Request {
	if k == 0 || jitter <= 0 {
		return reqs
	}
	rng := rand.New(rand.NewPCG(seed, 0x6a177e5<<8|uint64(k)))
	type moved struct {
		Request
		idx int
	}
	out := make([]moved, len(reqs))
	last := map[sessionKey]time.Duration{}
	for i, r := range reqs {
		at := max(0, r.At+time.Duration((2*rng.Float64()-1)*float64(jitter)))
		if len(r.IDs) >= 2 {
			g := sessionKey{r.IDs[0], r.IDs[1]}
			if prev, ok := last[g]; ok {
				at = max(at, prev)
			}
			last[g] = at
		}
		r.At = at
		out[i] = moved{r, i}
	}
	slices.SortStableFunc(out, func(a, b moved) int { return cmp.Compare(a.At, b.At) })
	res := make([]Request, len(out))
	for i, m := range out {
		res[i] = m.Request
	}
	return res
}

// Ceiling returns the reuse ceiling of reqs in arrival order: the
// token-weighted hit rate, in percent, of a single pod with an infinite
// GPU cache, computed from the block keys alone. Each request hits its
// longest prefix of full blocks that an earlier request stored (as
// Pod.Match counts hits); its partial last block never hits. No block
// ever leaves that cache for a CPU tier, so CPUHitWeight never applies:
// every hit counts 1, as a GPU hit does in RunResult.HitRate. No strategy
// over any number of pods can beat it, whatever their caches: a block a
// pod holds was stored by an earlier request.
func Ceiling(reqs []Request) float64 {
	seen := map[uint64]struct{}{}
	var prompt, hit int64
	for _, r := range reqs {
		n := 0
		for n < len(r.Keys) {
			if _, ok := seen[r.Keys[n]]; !ok {
				break
			}
			n++
		}
		for _, k := range r.Keys[n:] {
			seen[k] = struct{}{}
		}
		prompt += int64(r.Tokens())
		hit += int64(n * BlockTokens)
	}
	if prompt == 0 {
		return 0
	}
	return 100 * float64(hit) / float64(prompt)
}

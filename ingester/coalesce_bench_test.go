package ingester

import (
	"testing"

	"github.com/kvindex/kvindex/internal/sim/bench/paired"
	"github.com/kvindex/kvindex/internal/tier"
)

// BenchmarkCoalesce measures queueing a window's block operations in the
// opSet (the last put or delete per key wins, in first-op order) against
// the reference measured in the same loop (paired.Timer): the same
// operations assigned to a plain Go map keyed by the same (endpoint, tier,
// hash) triples. A window is 4,096 operations over 16 endpoints, a
// quarter of them repeats of an earlier key (a store then its removal).
// Metrics: ns/op-queued, map-ns/op-queued, x-map.
func BenchmarkCoalesce(b *testing.B) {
	eps := make([]*endpoint, 16)
	for i := range eps {
		eps[i] = &endpoint{}
	}
	type op struct {
		ep   *endpoint
		t    tier.Tier
		hash uint64
		del  bool
	}
	const window = DefaultWindowOps
	ops := make([]op, 0, window)
	for i := range window {
		if i%4 == 3 {
			prev := ops[i-3]
			prev.del = true
			ops = append(ops, prev)
			continue
		}
		ops = append(ops, op{ep: eps[i%len(eps)], t: tier.All[i%2], hash: uint64(i+1) * 0x9e3779b97f4a7c15})
	}
	s := newOpSet()
	ref := make(map[opKey]bool, 1024)
	var tm paired.Timer
	for b.Loop() {
		tm.Step(window, func() {
			for _, o := range ops {
				s.add(o.ep, o.t, o.hash, o.del)
			}
			s.reset()
		}, func() {
			for _, o := range ops {
				ref[opKey{ep: o.ep, hash: o.hash, tier: o.t}] = o.del
			}
			clear(ref)
		})
	}
	tm.Report(b, "op-queued", "map")
}

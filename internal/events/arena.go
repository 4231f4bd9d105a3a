package events

// arena hands out the slices of one batch (its events' BlockHashes and
// TokenIDs) from a few shared blocks instead of one allocation per event:
// a 64-event batch took 129 allocations before, 3 now (BENCHMARKS.md,
// "The decoder's reader"). Each slice it returns has its capacity capped at
// what was asked for, so an append by a caller reallocates instead of
// writing into the next event's elements. The zero value is ready to use;
// a block is never reused once the arena is replaced, so slices handed out
// stay valid for as long as they are referenced.
type arena[T any] struct {
	block []T
	// first sizes the first block, within [arenaFirst, arenaMax]: the
	// caller's estimate of the elements the batch holds.
	first int
}

// reuse empties a for a batch that replaces the last one: the slices
// handed out before are overwritten by the next takes. The newest block is
// kept unless it is past arenaMax (one outsized batch must not pin its
// memory), and first sizes a new block as for a fresh arena.
func (a *arena[T]) reuse(first int) {
	a.first = first
	if cap(a.block) > arenaMax {
		a.block = nil
		return
	}
	a.block = a.block[:0]
}

// arena block sizes, in elements: the first block, and the largest a
// block grows to by doubling (a bigger request gets a block of its own
// size).
const (
	arenaFirst = 256
	arenaMax   = 64 << 10
)

// take returns an empty slice with capacity n. n is bounded by the caller
// (by the bytes left in the payload), as for make.
func (a *arena[T]) take(n int) []T {
	if cap(a.block)-len(a.block) < n {
		size := 2 * cap(a.block)
		if a.block == nil {
			size = a.first
		}
		size = min(max(size, arenaFirst), arenaMax)
		a.block = make([]T, 0, max(size, n))
	}
	start := len(a.block)
	a.block = a.block[:start+n]
	return a.block[start : start : start+n]
}

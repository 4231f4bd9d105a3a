package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// treq is a request at ms milliseconds with hash ids ids (all full blocks
// but the last, which has 100 tokens).
func treq(ms int, ids ...uint64) Request {
	return Request{At: time.Duration(ms) * time.Millisecond, IDs: ids, Keys: chainKeys(ids[:len(ids)-1]), LastTokens: 100}
}

// sessionsTrace is a trace of three conversations (first two ids 0,1;
// 0,2; 0,3) of three turns each, all arriving in batches of three, and
// requests of one id that belong to none.
func sessionsTrace() []Request {
	var out []Request
	for turn := range 3 {
		at := 3000 * turn
		for s := uint64(1); s <= 3; s++ {
			ids := []uint64{0, s}
			for t := 0; t <= turn; t++ {
				ids = append(ids, 100*s+uint64(t))
			}
			out = append(out, treq(at, ids...))
		}
		out = append(out, treq(at+1000, 900+uint64(turn)))
	}
	return out
}

// turns returns, per session (its second id), the trace times of its
// requests in the order they arrive, and each request's identity (its
// last id) in that order.
func turns(reqs []Request) (bySession map[uint64][]time.Duration, ids []uint64) {
	bySession = map[uint64][]time.Duration{}
	for _, r := range reqs {
		ids = append(ids, r.IDs[len(r.IDs)-1])
		if len(r.IDs) >= 2 {
			bySession[r.IDs[1]] = append(bySession[r.IDs[1]], r.At)
		}
	}
	return bySession, ids
}

func TestArrivalOrder(t *testing.T) {
	tr := sessionsTrace()
	const jitter = 1500 * time.Millisecond
	for _, tc := range []struct {
		name   string
		k      int
		jitter time.Duration
		seed   uint64
	}{
		{"order_0_is_the_trace", 0, jitter, 17},
		{"no_jitter_is_the_trace", 2, 0, 17},
		{"order_1", 1, jitter, 17},
		{"order_2", 2, jitter, 17},
		{"another_seed", 1, jitter, 18},
		{"jitter_past_the_turn_spacing", 1, 10 * time.Second, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ArrivalOrder(tr, tc.k, tc.jitter, tc.seed)
			if tc.k == 0 || tc.jitter == 0 {
				if diff := cmp.Diff(tr, got); diff != "" {
					t.Errorf("(-trace +order):\n%s", diff)
				}
				return
			}
			// Deterministic: the same arguments give the same order.
			if diff := cmp.Diff(got, ArrivalOrder(tr, tc.k, tc.jitter, tc.seed)); diff != "" {
				t.Errorf("a second call differs (-first +second):\n%s", diff)
			}
			// The same requests, sorted by their new arrivals.
			_, ids := turns(got)
			_, want := turns(tr)
			slices.Sort(ids)
			slices.Sort(want)
			if diff := cmp.Diff(want, ids); diff != "" {
				t.Errorf("requests (-trace +order):\n%s", diff)
			}
			if !slices.IsSortedFunc(got, func(a, b Request) int { return int(a.At - b.At) }) {
				t.Error("arrivals are not sorted")
			}
			// Session order kept: a conversation's turns arrive in trace
			// order (each turn one id longer than the one before).
			var prev = map[uint64]int{}
			for _, r := range got {
				if len(r.IDs) < 2 {
					continue
				}
				if n, ok := prev[r.IDs[1]]; ok && len(r.IDs) != n+1 {
					t.Errorf("session %d: a turn of %d ids after one of %d", r.IDs[1], len(r.IDs), n)
				}
				prev[r.IDs[1]] = len(r.IDs)
			}
			// Within the jitter of its trace time, unless held back by an
			// earlier turn, which only delays.
			orig := map[uint64]time.Duration{}
			for _, r := range tr {
				orig[r.IDs[len(r.IDs)-1]] = r.At
			}
			for _, r := range got {
				at := orig[r.IDs[len(r.IDs)-1]]
				if r.At < at-tc.jitter || (len(r.IDs) < 2 && r.At > at+tc.jitter) {
					t.Errorf("request %v at %v moved past the jitter from %v", r.IDs, r.At, at)
				}
			}
			if cmp.Equal(tr, got) {
				t.Error("the jittered order is the trace's")
			}
		})
	}
	if cmp.Equal(ArrivalOrder(tr, 1, jitter, 17), ArrivalOrder(tr, 2, jitter, 17)) {
		t.Error("orders 1 and 2 are the same")
	}
	if cmp.Equal(ArrivalOrder(tr, 1, jitter, 17), ArrivalOrder(tr, 1, jitter, 18)) {
		t.Error("seeds 17 and 18 give the same order 1")
	}
}

// TestArrivalOrderHoldsATurnBack: a later turn whose jitter would put it
// before its session's previous turn arrives with it, after it.
func TestArrivalOrderHoldsATurnBack(t *testing.T) {
	// 20 turns of one session 1 ms apart under a 1 s jitter: without the
	// rule they would shuffle.
	var tr []Request
	for i := range 20 {
		ids := []uint64{0, 1}
		for t := 0; t <= i; t++ {
			ids = append(ids, uint64(10+t))
		}
		tr = append(tr, treq(i, ids...))
	}
	got := ArrivalOrder(tr, 1, time.Second, 17)
	var lens []int
	for _, r := range got {
		lens = append(lens, len(r.IDs))
	}
	want := make([]int, 20)
	for i := range want {
		want[i] = i + 3
	}
	if diff := cmp.Diff(want, lens); diff != "" {
		t.Errorf("turn lengths in arrival order (-trace +order):\n%s", diff)
	}
}

func TestCeiling(t *testing.T) {
	b := BlockTokens
	for _, tc := range []struct {
		name string
		reqs []Request
		want float64
	}{
		{
			// The first request misses its 2 full blocks; the second
			// hits both (1024 of 1124 tokens) and misses its third.
			name: "a prefix reused",
			reqs: []Request{treq(0, 1, 2, 9), treq(1, 1, 2, 3, 9)},
			want: 100 * float64(2*b) / float64((2*b+100)+(3*b+100)),
		},
		{
			// The third request shares block 1 only: ids 1,4 key block 2
			// apart from 1,2. The fourth repeats the second: all 3 full
			// blocks hit.
			name: "a divergent block ends the prefix",
			reqs: []Request{treq(0, 1, 2, 9), treq(1, 1, 2, 3, 9), treq(2, 1, 4, 3, 9), treq(3, 1, 2, 3, 9)},
			want: 100 * float64(2*b+1*b+3*b) / float64((2*b+100)+2*(3*b+100)+(3*b+100)),
		},
		{
			name: "the partial last block never hits",
			reqs: []Request{treq(0, 7), treq(1, 7)},
			want: 0,
		},
		{name: "empty", want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Ceiling(tc.reqs)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The ceiling bounds every pod: a pod with a cache as large as the trace
// (so it never evicts) reaches it exactly.
func TestCeilingIsAnUnboundedPod(t *testing.T) {
	tr := sessionsTrace()
	p := NewPod(1000, 0, 1)
	var prompt, hit int64
	for _, r := range tr {
		s := p.Serve(r.Keys, r.IDs[:len(r.IDs)-1])
		prompt += int64(r.Tokens())
		hit += int64(s.GPUHits * BlockTokens)
	}
	if got, want := Ceiling(tr), 100*float64(hit)/float64(prompt); got != want {
		t.Errorf("Ceiling = %v, an unbounded pod %v", got, want)
	}
}

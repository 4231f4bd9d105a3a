package gie

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func seq(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i + 1)
	}
	return out
}

func TestSpeculativeTTL(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := NewSpeculative(2*time.Second, 0, 100, 4, c.now)
	a, b := Identity{Pod: "a"}, Identity{Pod: "b"}
	keys := s.Keys("m", Prompt{TokenIDs: seq(10)}) // 2 full blocks
	if len(keys) != 2 {
		t.Fatalf("keys = %d, want 2", len(keys))
	}
	s.Remember(keys, a)
	if got := s.Match(keys, a, time.Time{}); got != 2 {
		t.Errorf("match a = %d, want 2", got)
	}
	if got := s.Match(keys, b, time.Time{}); got != 0 {
		t.Errorf("match b = %d, want 0", got)
	}
	// A longer prompt sharing the first block matches one block.
	longer := s.Keys("m", Prompt{TokenIDs: append(seq(4), 99, 98, 97, 96)})
	if got := s.Match(longer, a, time.Time{}); got != 1 {
		t.Errorf("match of a prompt sharing one block = %d, want 1", got)
	}
	c.add(1999 * time.Millisecond)
	if got := s.Match(keys, a, time.Time{}); got != 2 {
		t.Errorf("before the TTL: match = %d, want 2", got)
	}
	c.add(time.Millisecond)
	if got := s.Match(keys, a, time.Time{}); got != 0 {
		t.Errorf("at the TTL: match = %d, want 0", got)
	}
	s.Remember(s.Keys("m", Prompt{TokenIDs: seq(4)}), b)
	if got := s.Len(); got != 1 {
		t.Errorf("after expiry and one new entry: len = %d, want 1", got)
	}
}

func TestSpeculativeBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := NewSpeculative(time.Minute, 0, 3, 1, c.now)
	a := Identity{Pod: "a"}
	first := s.Keys("m", Prompt{TokenIDs: []uint32{1, 2}})
	s.Remember(first, a)
	second := s.Keys("m", Prompt{TokenIDs: []uint32{7, 8}})
	s.Remember(second, a)
	if got := s.Len(); got != 3 {
		t.Fatalf("len = %d, want the bound 3", got)
	}
	if got := s.Match(first, a, time.Time{}); got != 0 {
		t.Errorf("the oldest entry was not dropped: match = %d", got)
	}
	if got := s.Match(second, a, time.Time{}); got != 2 {
		t.Errorf("newest entries: match = %d, want 2", got)
	}
}

// A prompt longer than the bound keeps its leading blocks, the ones Match
// credits. Before, it kept its tail, and matched nothing.
func TestSpeculativeLongerThanTheBound(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := NewSpeculative(time.Minute, 0, 100, 1, c.now)
	a := Identity{Pod: "a"}
	keys := s.Keys("m", Prompt{TokenIDs: seq(150)})
	s.Remember(keys, a)
	if got := s.Len(); got != 100 {
		t.Fatalf("len = %d, want the bound 100", got)
	}
	if got := s.Match(keys, a, time.Time{}); got != 100 {
		t.Errorf("match = %d, want the 100 leading blocks", got)
	}
}

func TestSpeculativeKeysSeparate(t *testing.T) {
	s := NewSpeculative(time.Second, 0, 100, 2, nil)
	base := Prompt{TokenIDs: seq(4)}
	k := s.Keys("m", base)
	variants := map[string][]uint64{
		"model":      s.Keys("other", base),
		"lora":       s.Keys("m", Prompt{TokenIDs: seq(4), LoRAName: "x"}),
		"salt":       s.Keys("m", Prompt{TokenIDs: seq(4), CacheSalt: "s"}),
		"multimodal": s.Keys("m", Prompt{TokenIDs: seq(4), MultiModal: []MultiModalItem{{Hash: "img", Offset: 1, Length: 2}}}),
	}
	for name, v := range variants {
		if v[0] == k[0] {
			t.Errorf("%s: the first block's key is the same", name)
		}
	}
	// A multimodal item in the second block leaves the first block's key.
	mm := s.Keys("m", Prompt{TokenIDs: seq(4), MultiModal: []MultiModalItem{{Hash: "img", Offset: 2, Length: 2}}})
	if mm[0] != k[0] || mm[1] == k[1] {
		t.Errorf("an item in block 1 changes exactly block 1's key")
	}
}

func TestSpeculativeDisabled(t *testing.T) {
	s := NewSpeculative(0, 0, 100, 2, nil)
	k := s.Keys("m", Prompt{TokenIDs: seq(4)})
	s.Remember(k, Identity{Pod: "a"})
	if s.Len() != 0 || s.Match(k, Identity{Pod: "a"}, time.Time{}) != 0 {
		t.Error("a zero TTL remembers")
	}
}

func TestSpeculativeNotRenewedByALaterDecision(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s := NewSpeculative(2*time.Second, 0, 100, 4, c.now)
	a := Identity{Pod: "a"}
	keys := s.Keys("m", Prompt{TokenIDs: seq(8)})
	s.Remember(keys, a)
	c.add(1500 * time.Millisecond)
	s.Remember(keys, a) // a decision the entries themselves won
	c.add(500 * time.Millisecond)
	if got := s.Match(keys, a, time.Time{}); got != 0 {
		t.Errorf("2 s after the first decision: match = %d, want 0 (a later decision renewed the entries)", got)
	}
	if got := s.Len(); got != 2 {
		t.Errorf("len = %d, want 2 (the repeated decision added no entries)", got)
	}
}

func TestSpeculativeDroppedOnceTheIndexCaughtUp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &clock{t: t0}
	s := NewSpeculative(2*time.Second, 500*time.Millisecond, 100, 4, c.now)
	a := Identity{Pod: "a"}
	keys := s.Keys("m", Prompt{TokenIDs: seq(8)})
	s.Remember(keys, a)
	c.add(time.Second)
	for _, tc := range []struct {
		name     string
		progress time.Time
		want     int
	}{
		{"progress_not_said", time.Time{}, 2},
		{"progress_before_the_decision", t0.Add(-time.Second), 2},
		{"progress_within_the_lag", t0.Add(499 * time.Millisecond), 2},
		{"progress_caught_up", t0.Add(500 * time.Millisecond), 0},
		// Dropped: an older answer afterwards does not bring them back.
		{"dropped_for_good", t0.Add(100 * time.Millisecond), 0},
	} {
		if got := s.Match(keys, a, tc.progress); got != tc.want {
			t.Errorf("%s: match = %d, want %d", tc.name, got, tc.want)
		}
	}
	// A new decision after the drop is remembered afresh.
	s.Remember(keys, a)
	if got := s.Match(keys, a, t0.Add(500*time.Millisecond)); got != 2 {
		t.Errorf("a decision after the drop: match = %d, want 2", got)
	}
}

// BenchmarkSpeculativeMemory reports the heap one remembered (block,
// endpoint) entry costs, at the default bound (200,000 entries, from
// prompts of 1,024 blocks sent to 8 endpoints in turn), and the time of a
// Remember of one such prompt.
func BenchmarkSpeculativeMemory(b *testing.B) {
	const entries, blocks = DefaultSpeculativeMaxEntries, 1024
	prompt := func(i int) []uint64 {
		keys := make([]uint64, blocks)
		for j := range keys {
			keys[j] = uint64(i)<<32 | uint64(j)
		}
		return keys
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var perEntry float64
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		s := NewSpeculative(time.Hour, 0, entries, 16, nil)
		before := heap()
		b.StartTimer()
		for p := 0; p < entries/blocks; p++ {
			s.Remember(prompt(i*1000+p), Identity{Pod: fmt.Sprintf("10.0.0.%d:8000", p%8)})
		}
		b.StopTimer()
		perEntry = float64(heap()-before) / float64(s.Len())
		runtime.KeepAlive(s)
		b.StartTimer()
	}
	b.ReportMetric(perEntry, "B/entry")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(entries/blocks)), "ns/remember")
}

package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

func TestLookupCost(t *testing.T) {
	ks := keyspace.Default()
	ix := index.New(ks)
	ep := keyspace.Endpoint{Model: Model, Pod: "p"}
	queries := [][]uint64{{1, 2, 3}, {4, 5}, {6}}
	for _, q := range queries {
		for _, h := range q {
			if err := ix.Put(ep, tier.GPU, h); err != nil {
				t.Fatal(err)
			}
		}
	}
	keys := func(yield func(uint64)) {
		for _, q := range queries {
			for _, h := range q {
				yield(h)
			}
		}
	}
	c := NewLookupCost(ix, Model, queries, keys, 1)
	for i := range 2 * c.Rotation() {
		if err := c.Step(i); err != nil {
			t.Fatal(err)
		}
	}
	if c.Steps != 6 || c.Hashes != 12 || c.Sink() != 12 {
		t.Fatalf("steps %d hashes %d sink %d: want 6 steps over 12 hashes, every reference probe a hit", c.Steps, c.Hashes, c.Sink())
	}
	if c.LookupNs() <= 0 || c.MapNs() <= 0 {
		t.Fatalf("ns/hash %v and %v: want both positive", c.LookupNs(), c.MapNs())
	}
	// A query the index does not hold in full is an error, not a figure.
	bad := NewLookupCost(ix, Model, [][]uint64{{1, 2, 99}}, keys, 1)
	if err := bad.Step(0); err == nil {
		t.Fatal("a query not held in full was accepted")
	}
}

func TestMeasureCalls(t *testing.T) {
	ctx := context.Background()
	t.Run("count_bound", func(t *testing.T) {
		l, err := MeasureCalls(ctx, 3, 50, 0, func(int) error { return nil })
		if err != nil || len(l.Sorted) != 50 {
			t.Fatalf("%d calls, %v: want 50", len(l.Sorted), err)
		}
		if l.Percentile(0.5) > l.Percentile(0.99) || l.Percentile(0.99) > l.Max() {
			t.Fatalf("percentiles out of order: %v %v %v", l.Percentile(0.5), l.Percentile(0.99), l.Max())
		}
	})
	t.Run("duration_bound", func(t *testing.T) {
		l, err := MeasureCalls(ctx, 2, 0, 20*time.Millisecond, func(int) error { return nil })
		if err != nil || len(l.Sorted) == 0 || l.PerSecond() <= 0 {
			t.Fatalf("%d calls, %v", len(l.Sorted), err)
		}
	})
	t.Run("stops_at_error", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := MeasureCalls(ctx, 2, 1000, 0, func(i int) error {
			if i == 10 {
				return boom
			}
			return nil
		})
		if !errors.Is(err, boom) {
			t.Fatalf("error %v, want boom", err)
		}
	})
	t.Run("needs_a_bound", func(t *testing.T) {
		if _, err := MeasureCalls(ctx, 1, 0, 0, func(int) error { return nil }); err == nil {
			t.Fatal("no bound accepted")
		}
	})
}

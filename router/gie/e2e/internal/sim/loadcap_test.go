package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoadCap(t *testing.T) {
	// 4 pods, a window of 8 requests, slack 1.5: a pod may take 3 of 8.
	c := NewLoadCap(4, 8, 1.5)
	for range 3 {
		c.Add(0)
	}
	if diff := cmp.Diff([]bool{false, true, true, true}, c.Allowed()); diff != "" {
		t.Fatalf("after pod 0 took 3 of 8 (-want +got):\n%s", diff)
	}
	// Five more requests elsewhere push pod 0's first out of the window.
	for _, p := range []int{1, 2, 3, 1, 2} {
		c.Add(p)
	}
	if diff := cmp.Diff([]bool{false, true, true, true}, c.Allowed()); diff != "" {
		t.Fatalf("window full, pod 0 still at 3 (-want +got):\n%s", diff)
	}
	c.Add(3)
	if diff := cmp.Diff([]bool{true, true, true, true}, c.Allowed()); diff != "" {
		t.Fatalf("pod 0's first request left the window (-want +got):\n%s", diff)
	}
}

func TestLoadCapOff(t *testing.T) {
	c := NewLoadCap(3, 0, 1.5)
	for range 100 {
		c.Add(1)
	}
	if diff := cmp.Diff([]bool{true, true, true}, c.Allowed()); diff != "" {
		t.Errorf("window 0 capped (-want +got):\n%s", diff)
	}
}

// TestLoadCapBoundsEveryPod: whatever the router wants, a pod that keeps
// asking never exceeds slack x its share of any window.
func TestLoadCapBoundsEveryPod(t *testing.T) {
	const pods, window = 8, 200
	c := NewLoadCap(pods, window, 1.5)
	rng := rand.New(rand.NewPCG(3, 4))
	var hist []int
	for range 5000 {
		allowed := c.Allowed()
		// A router that prefers pod 0, then the lowest allowed.
		pick := -1
		if rng.IntN(10) > 0 {
			for p, ok := range allowed {
				if ok {
					pick = p
					break
				}
			}
		} else {
			for pick = rng.IntN(pods); !allowed[pick]; pick = rng.IntN(pods) {
			}
		}
		c.Add(pick)
		hist = append(hist, pick)
		if len(hist) >= window {
			n := 0
			for _, p := range hist[len(hist)-window:] {
				if p == 0 {
					n++
				}
			}
			if float64(n) > 1.5*window/pods {
				t.Fatalf("pod 0 took %d of the last %d requests, over its cap of %v", n, window, 1.5*window/pods)
			}
		}
	}
}

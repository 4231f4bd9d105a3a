package testutil

import (
	"testing"
	"time"
)

// Seed returns a seed for a test's random stream, from the clock, and has
// t log it once t has failed ("seed N"), so a failure can be replayed by
// putting N back in place of the call.
func Seed(t testing.TB) uint64 {
	seed := uint64(time.Now().UnixNano())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d", seed)
		}
	})
	return seed
}

package index_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the Loader
// sorts a list's buckets on goroutines of its own (load.go), which must
// all be done when Finish returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

package deploy

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testutil"
)

// TestMain checks that the tests that run real components (an etcd member
// with a build's TLS settings, an indexd replica) leave no goroutine
// behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

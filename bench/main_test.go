package bench

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) {
	if code, ok := EtcdNodeMain(); ok {
		os.Exit(code) // startEtcdChild runs this test binary as etcd
	}
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

package standalonecmd

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

package testutil

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// ScaleEnv names the environment variable that multiplies every wait of
// kvindex's tests: KVINDEX_TEST_TIMEOUT_SCALE=3 gives every test three
// times as long to see what it waits for, on a loaded or slow machine.
// Unset or empty means 1. The waits themselves are set generously (many
// times what an idle machine needs), so a test fails only for a real
// reason, not from load; the scale is for machines slower still.
const ScaleEnv = "KVINDEX_TEST_TIMEOUT_SCALE"

// Scale is the factor of ScaleEnv: 1 when unset, else its value, which
// must be a positive number (a bad value panics, naming it, so a typo is
// not silently the default).
func Scale() float64 {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		panic(fmt.Sprintf("%s=%q: want a positive number", ScaleEnv, v))
	}
	return f
}

// Timeout returns d times Scale: the bound of one wait in a test.
func Timeout(d time.Duration) time.Duration {
	return time.Duration(float64(d) * Scale())
}

// Context returns a context that ends after Timeout(d), or when the test
// ends, whichever is first.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout(d))
	t.Cleanup(cancel)
	return ctx
}

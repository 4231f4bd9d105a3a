package testutil

import (
	"bytes"
	"regexp"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is an io.Writer that a command running in another goroutine
// writes its output to while the test reads it: bytes.Buffer behind a
// mutex.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WaitMatch polls b until re matches what was written and returns the
// match's first submatch (the whole match when re has no group). It fails
// the test, showing the output, after Timeout(d): how a test reads an
// address a command bound on port 0 and printed.
func (b *SyncBuffer) WaitMatch(t testing.TB, re *regexp.Regexp, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(Timeout(d))
	for {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m[len(m)-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no output matching %s after %v:\n%s", re, Timeout(d), b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

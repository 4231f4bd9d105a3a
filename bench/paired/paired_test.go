package paired

import (
	"testing"
	"time"
)

func TestTimerStep(t *testing.T) {
	var tm Timer
	var measured, reference int
	for range 3 {
		tm.Step(10, func() { measured++; time.Sleep(2 * time.Millisecond) }, func() { reference++ })
	}
	if measured != 3 || reference != 3 || tm.Units != 30 {
		t.Fatalf("ran %d and %d batches over %d units, want 3, 3, 30", measured, reference, tm.Units)
	}
	if tm.Measured < 6*time.Millisecond || tm.NsPer() <= tm.RefNsPer() {
		t.Fatalf("measured %v (%v ns/unit) against reference %v ns/unit: the sleeping side must be the slower", tm.Measured, tm.NsPer(), tm.RefNsPer())
	}
}

// Package paired times a measured operation and its reference in the same
// loop, batch after batch, so both see the same machine load (kvindex's
// rule: a benchmark reports a ratio against a reference measured in the
// same run). It has no dependencies beyond the standard library, so any
// package's benchmarks can use it.
//
// Not production code (internal/sim): only benchmarks import it.
package paired

import (
	"testing"
	"time"
)

// Timer accumulates the time of a measured batch and of its reference
// batch. The zero value is ready.
type Timer struct {
	// Measured and Reference sum the batches' times; Units counts the
	// units of work each side did (the same for both).
	Measured, Reference time.Duration
	Units               int
}

// Step times measured, then reference; each must do units units of work
// (keys encoded, operations applied). Batches should be long enough
// (microseconds) that reading the clock is noise.
func (t *Timer) Step(units int, measured, reference func()) {
	t0 := time.Now()
	measured()
	t1 := time.Now()
	reference()
	t2 := time.Now()
	t.Measured += t1.Sub(t0)
	t.Reference += t2.Sub(t1)
	t.Units += units
}

// NsPer is the measured side's nanoseconds per unit.
func (t *Timer) NsPer() float64 { return float64(t.Measured.Nanoseconds()) / float64(t.Units) }

// RefNsPer is the reference's nanoseconds per unit.
func (t *Timer) RefNsPer() float64 { return float64(t.Reference.Nanoseconds()) / float64(t.Units) }

// Report reports ns/UNIT, REF-ns/UNIT and x-REF (measured over reference)
// on b, and zeroes ns/op (the batches are timed above, not the loop).
func (t *Timer) Report(b *testing.B, unit, ref string) {
	b.ReportMetric(t.NsPer(), "ns/"+unit)
	b.ReportMetric(t.RefNsPer(), ref+"-ns/"+unit)
	b.ReportMetric(t.NsPer()/t.RefNsPer(), "x-"+ref)
	b.ReportMetric(0, "ns/op")
}

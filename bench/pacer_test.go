package bench

import (
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
)

func opsStream(ops ...int) *Stream {
	s := &Stream{}
	for _, n := range ops {
		s.Records = append(s.Records, Record{BlockOps: n, Value: make([]byte, n)})
		s.BlockOps += n
		s.MaxBlockOps = max(s.MaxBlockOps, n)
	}
	return s
}

// TestPacerSchedule checks the pacer's schedule on a fixed clock: the
// bucket starts full (one largest record), then each record waits for its
// block ops at the rate, so record i goes at (ops up to and including i −
// burst) / rate; and prefixFor counts the records that schedule hands out
// within a duration.
func TestPacerSchedule(t *testing.T) {
	s := opsStream(100, 50, 100, 100, 20, 80)
	p, err := newPacer(1000, s.MaxBlockOps) // 1,000 block ops/s, burst 100
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	var got []time.Duration
	for _, r := range s.Records {
		got = append(got, p.delay(now, r.BlockOps))
	}
	// Cumulative ops 100, 150, 250, 350, 370, 450; less the burst of 100,
	// at 1 ms per op.
	want := []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond, 250 * time.Millisecond, 270 * time.Millisecond, 350 * time.Millisecond}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("delays (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{0, 6}, {time.Millisecond, 1}, {50 * time.Millisecond, 2}, {249 * time.Millisecond, 3}, {270 * time.Millisecond, 5}, {time.Hour, 6},
	} {
		if got := prefixFor(s, 1000, tc.d); got != tc.want {
			t.Errorf("prefixFor(%s) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestPacerRefusesBadRates(t *testing.T) {
	for _, r := range []float64{0, -1} {
		if _, err := newPacer(r, 10); err == nil {
			t.Errorf("rate %v accepted", r)
		}
	}
}

func TestStreamPrefix(t *testing.T) {
	s := opsStream(100, 50, 100, 20)
	s.Events = 9
	p := s.Prefix(2)
	if len(p.Records) != 2 || p.BlockOps != 150 || p.MaxBlockOps != 100 || p.Bytes != 150 {
		t.Fatalf("prefix: %d records, %d block ops, max %d, %d bytes", len(p.Records), p.BlockOps, p.MaxBlockOps, p.Bytes)
	}
	if s.Prefix(4) != s || s.Prefix(-1) != s {
		t.Fatal("a prefix of the whole stream (or out of range) is not the stream")
	}
}

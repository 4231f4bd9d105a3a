package inspectcmd

import (
	"github.com/kvindex/kvindex/internal/tier"
)

// fillStats is the fill of a set of chunks.
type fillStats struct {
	Tier    string  `json:"tier"`
	Chunks  int     `json:"chunks"`
	Entries int     `json:"entries"`
	Fill    float64 `json:"fill"`
	Min     int     `json:"min"`
	Mean    float64 `json:"mean"`
	Max     int     `json:"max"`
	// Histogram counts the chunks by entries, in buckets of a eighth of
	// the chunk size (the last bucket also takes chunks past the size);
	// only in the per-tier totals.
	Histogram []bucket `json:"histogram,omitempty"`
}

// bucket is one histogram bucket: chunks holding From to To entries.
type bucket struct {
	From   int `json:"from"`
	To     int `json:"to"`
	Chunks int `json:"chunks"`
}

// histogramBuckets is the number of histogram buckets.
const histogramBuckets = 8

func newFill(t tier.Tier, chunkSize int, histogram bool) *fillStats {
	f := &fillStats{Tier: t.String()}
	if histogram {
		width := max(1, (chunkSize+histogramBuckets-1)/histogramBuckets)
		for from := 1; from <= chunkSize; from += width {
			f.Histogram = append(f.Histogram, bucket{From: from, To: min(from+width-1, chunkSize)})
		}
	}
	return f
}

// add counts one chunk of n entries.
func (f *fillStats) add(n int) {
	if f.Chunks == 0 || n < f.Min {
		f.Min = n
	}
	f.Max = max(f.Max, n)
	f.Chunks++
	f.Entries += n
	for i := range f.Histogram {
		if n <= f.Histogram[i].To || i == len(f.Histogram)-1 {
			f.Histogram[i].Chunks++
			break
		}
	}
}

// done computes the ratios for chunks of chunkSize.
func (f *fillStats) done(chunkSize int) {
	if f.Chunks > 0 {
		f.Mean = float64(f.Entries) / float64(f.Chunks)
		f.Fill = f.Mean / float64(chunkSize)
	}
}

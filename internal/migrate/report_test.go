package migrate

import (
	"strings"
	"testing"
)

// TestReportNamesAnEmptySource: a report of a source prefix that held
// nothing says so, since "endpoints: 0" and exit 0 read as a success
// (a mistyped --from-prefix); a report of anything read does not.
func TestReportNamesAnEmptySource(t *testing.T) {
	const note = "no v1 key under /typo/v1/"
	for _, tc := range []struct {
		name string
		edit func(*Report)
		want bool
	}{
		{"nothing", func(*Report) {}, true},
		{"only_v2_chunks_left_alone", func(r *Report) { r.Skipped["v2_chunks_without_record"] = 2 }, true},
		{"an_endpoint", func(r *Report) { r.Endpoints = 1 }, false},
		{"an_offset", func(r *Report) { r.Offsets = 1 }, false},
		{"blocks_skipped", func(r *Report) { r.Skipped["blocks_without_record"] = 3 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{From: "/typo/v1/", To: "/kvindex/v2/", DryRun: true, Blocks: map[string]int{}, Chunks: map[string]int{}, Skipped: map[string]int{}, MinLeaseTTL: -1}
			tc.edit(r)
			var b strings.Builder
			if err := r.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(b.String(), note); got != tc.want {
				t.Fatalf("report says %q: %v, want %v; report:\n%s", note, got, tc.want, b.String())
			}
		})
	}
}

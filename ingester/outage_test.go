package ingester

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
)

// The watch's verdicts over a timeline of records (their timestamps) and
// end-offset listings, on a fake clock, with a 15 s threshold.
func TestOutageWatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at     time.Duration // the clock, from t0
		record time.Duration // a record stamped t0+record (-1: none)
		ends   map[int32]int64
		want   outageState
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"records_every_5s_no_outage", []step{
			{at: 5 * time.Second, record: 5 * time.Second, want: outageState{since: at(5 * time.Second)}},
			{at: 10 * time.Second, record: 10 * time.Second, want: outageState{since: at(10 * time.Second)}},
			{at: 24 * time.Second, record: -1, want: outageState{since: at(10 * time.Second)}},
		}},
		{"silence_past_threshold_is_ongoing_then_ends_with_credit", []step{
			{at: 5 * time.Second, record: 5 * time.Second, want: outageState{since: at(5 * time.Second)}},
			{at: 21 * time.Second, record: -1, want: outageState{ongoing: true, since: at(5 * time.Second)}},
			{at: 65 * time.Second, record: 65 * time.Second, want: outageState{since: at(65 * time.Second), ended: 1, lastEnd: at(65 * time.Second), credit: 60 * time.Second}},
		}},
		{"end_offsets_of_other_partitions_are_evidence", []step{
			{at: 1 * time.Second, record: -1, ends: map[int32]int64{0: 10, 1: 4}, want: outageState{since: at(0)}}, // baseline only
			{at: 14 * time.Second, record: -1, ends: map[int32]int64{0: 10, 1: 5}, want: outageState{since: at(14 * time.Second)}},
			{at: 28 * time.Second, record: -1, ends: map[int32]int64{0: 10, 1: 5}, want: outageState{since: at(14 * time.Second)}},
			{at: 30 * time.Second, record: -1, want: outageState{ongoing: true, since: at(14 * time.Second)}},
			{at: 40 * time.Second, record: -1, ends: map[int32]int64{0: 11, 1: 5}, want: outageState{since: at(40 * time.Second), ended: 1, lastEnd: at(40 * time.Second), credit: 26 * time.Second}},
		}},
		{"late_old_record_is_no_news", []step{
			{at: 20 * time.Second, record: 2 * time.Second, want: outageState{ongoing: true, since: at(2 * time.Second)}},
		}},
		{"future_record_counts_as_now", []step{
			{at: 3 * time.Second, record: time.Hour, want: outageState{since: at(3 * time.Second)}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClockAt(t0)
			o := newOutageWatch(clock, 15*time.Second)
			for i, s := range tc.steps {
				clock.Advance(t0.Add(s.at).Sub(clock.Now()))
				if s.record >= 0 {
					o.saw(t0.Add(s.record))
				}
				if s.ends != nil {
					o.sawEnds(s.ends)
				}
				if diff := cmp.Diff(s.want, o.state(), cmp.AllowUnexported(outageState{})); diff != "" {
					t.Fatalf("step %d (t0+%v): state (-want +got):\n%s", i, s.at, diff)
				}
			}
		})
	}
}

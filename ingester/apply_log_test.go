package ingester

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// testApplier is an applier on its own (no etcd, no Kafka: it does no
// I/O) whose logs go to buf.
func testApplier(t *testing.T, buf *bytes.Buffer) *applier {
	t.Helper()
	cfg := DefaultConfig().withDefaults()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &applier{cfg: &cfg, p: keyspace.Partition{Topic: "t"}, log: slog.New(slog.NewTextHandler(buf, nil)), m: m,
		dec: events.NewDecoder(nil), eps: map[keyspace.Endpoint]*endpoint{}, win: newWindow()}
}

func header(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }

// Header values are the producer's: a 500 KB kind and a seq of 100,000
// digits are logged clipped, with their length.
func TestSkippedRecordLogsBoundedValues(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []kgo.RecordHeader
		reason  string
	}{
		{"huge_kind", []kgo.RecordHeader{header("model", "m"), header("kind", strings.Repeat("k", 500_000))}, skipUnknownKind},
		{"huge_seq", []kgo.RecordHeader{header("model", "m"), header("seq", strings.Repeat("9", 100_000))}, skipBadSeq},
		{"huge_format", []kgo.RecordHeader{header("model", "m"), header("format", strings.Repeat("é", 100_000))}, skipUnknownFmt},
		{"huge_dp_rank", []kgo.RecordHeader{header("model", "m"), header("dp_rank", strings.Repeat("1", 100_000))}, skipBadDPRank},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			a := testApplier(t, &buf)
			a.record(&kgo.Record{Key: []byte("pod"), Headers: tc.headers, Value: []byte{0x90}, Timestamp: time.Now()}, false)
			if n := promtest.ToFloat64(a.m.skippedRecords.WithLabelValues(tc.reason)); n != 1 {
				t.Fatalf("skipped_records_total{reason=%s} = %v, want 1", tc.reason, n)
			}
			if n := buf.Len(); n > 400 {
				t.Fatalf("the skip logged %d bytes, want one short line: %.300q", n, buf.String())
			}
			if !strings.Contains(buf.String(), "bytes)") {
				t.Errorf("the log line %q does not give the value's length", buf.String())
			}
		})
	}
}

// A contract header given twice with different values makes the record
// ambiguous: it is skipped (repeated_header) and counted by header; given
// twice with the same value, it is read once.
func TestRepeatedHeaders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []kgo.RecordHeader
		want    string // repeated header, "" for none
	}{
		{"two_models", []kgo.RecordHeader{header("model", "a"), header("model", "b"), header("kind", "heartbeat")}, "model"},
		{"two_kinds", []kgo.RecordHeader{header("model", "a"), header("kind", "heartbeat"), header("kind", "goodbye")}, "kind"},
		{"two_ranks", []kgo.RecordHeader{header("model", "a"), header("dp_rank", "0"), header("dp_rank", "1"), header("kind", "heartbeat")}, "dp_rank"},
		{"same_model_twice", []kgo.RecordHeader{header("model", "a"), header("model", "a"), header("kind", "heartbeat")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			a := testApplier(t, &buf)
			a.record(&kgo.Record{Key: []byte("pod"), Headers: tc.headers, Timestamp: time.Now()}, false)
			skipped := promtest.ToFloat64(a.m.skippedRecords.WithLabelValues(skipRepeatedHeader))
			if tc.want == "" {
				if skipped != 0 || len(a.eps) != 1 {
					t.Fatalf("skipped %v, %d endpoints; want the heartbeat applied", skipped, len(a.eps))
				}
				return
			}
			if skipped != 1 || len(a.eps) != 0 {
				t.Fatalf("skipped %v, %d endpoints; want the record skipped", skipped, len(a.eps))
			}
			if n := promtest.ToFloat64(a.m.repeatedHeader.WithLabelValues(tc.want)); n != 1 {
				t.Errorf("repeated_headers_total{header=%s} = %v, want 1", tc.want, n)
			}
		})
	}
}

// The events-skipped line names every reason with its count.
func TestSkipSummary(t *testing.T) {
	got := skipSummary([]events.Skip{
		{Reason: events.SkipUnknownMedium}, {Reason: events.SkipInvalid}, {Reason: events.SkipUnknownMedium},
		{Reason: events.SkipOtherGroup}, {Reason: events.SkipUnknownMedium},
	})
	if diff := cmp.Diff("unknown_medium=3 invalid_event=1 other_group=1", got); diff != "" {
		t.Fatalf("skipSummary (-want +got):\n%s", diff)
	}
}

func TestClip(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"short_whole", "heartbeat", "heartbeat"},
		{"long_cut", strings.Repeat("a", 100), strings.Repeat("a", 64) + "…(100 bytes)"},
		{"cut_at_rune_start", strings.Repeat("é", 40), strings.Repeat("é", 32) + "…(80 bytes)"},
		{"cut_inside_rune_backs_off", "a" + strings.Repeat("é", 40), "a" + strings.Repeat("é", 31) + "…(81 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clip(tc.in); got != tc.want {
				t.Fatalf("clip = %q, want %q", got, tc.want)
			}
		})
	}
	// An error's text keeps 256 bytes: the decoder's own message whole,
	// a producer's value quoted in it still bounded.
	msg := "events: malformed batch: batch claims 4294967295 elements but only 3 bytes follow"
	if got := clipErr(msg); got != msg {
		t.Errorf("clipErr cut a decoder message: %q", got)
	}
	if got, want := clipErr(strings.Repeat("x", 300)), strings.Repeat("x", 256)+"…(300 bytes)"; got != want {
		t.Errorf("clipErr = %q, want %q", got, want)
	}
}

// A backlog whose record times jump over a silence nobody consumed (the
// whole stack was down; the previous owner left records unapplied before
// it) gives every endpoint the grace at the jump, not only at the claim:
// the replayed records before the jump made no gap.
func TestBacklogGapGivesGrace(t *testing.T) {
	var buf bytes.Buffer
	a := testApplier(t, &buf)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	hb := func(pod string, at time.Time) *kgo.Record {
		return &kgo.Record{Key: []byte(pod), Headers: []kgo.RecordHeader{header("model", "m"), header("kind", "heartbeat")}, Timestamp: at}
	}
	a.record(hb("a", t0), true)
	a.record(hb("b", t0), true)
	a.claimed() // a new owner loads both, then replays the backlog
	a.record(hb("a", t0.Add(time.Second)), true)
	a.record(hb("a", t0.Add(time.Minute)), true) // the jump: b silent for 60 s
	if len(a.eps) != 2 {
		t.Fatalf("endpoints after a 60 s jump in the backlog: %d, want 2 (the grace)", len(a.eps))
	}
	for d := 5 * time.Second; d <= a.cfg.OutageGrace+5*time.Second; d += 5 * time.Second {
		a.record(hb("a", t0.Add(time.Minute+d)), true) // a heartbeats every 5 s
	}
	if _, ok := a.eps[keyspace.Endpoint{Model: "m", Pod: "b"}]; ok {
		t.Fatalf("b is still there after the grace\n%s", buf.String())
	}
	if n := promtest.ToFloat64(a.m.outages.WithLabelValues("gap")); n != 1 {
		t.Errorf("outages_total{kind=gap} = %v, want 1", n)
	}
}

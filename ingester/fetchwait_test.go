package ingester

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// TestFetchesWaitAtMostFetchMaxWait: the ingester's fetches ask the broker
// to hold them at most FetchMaxWait. The client sends one fetch per broker
// at a time, so a partition resumed after QueueBytes paused it waits for
// the fetch in flight for the caught-up partitions; with franz-go's 5 s
// default that fetch sat at the broker for 5 s, and a backlogged partition
// was read at one fetch per 5 s (the end-to-end ceiling of `kvindex bench
// fleet` doubled once this wait came down to 100 ms).
func TestFetchesWaitAtMostFetchMaxWait(t *testing.T) {
	const topic = "fetchwait"
	e := newEnv(t, 1, []string{topic})
	var (
		mu    sync.Mutex
		waits []int32
	)
	e.kafka.Cluster.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.Cluster.KeepControl()
		mu.Lock()
		waits = append(waits, req.(*kmsg.FetchRequest).MaxWaitMillis)
		mu.Unlock()
		return nil, nil, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-fetchwait", "/kvindex/fetchwait/")
	if cfg.FetchMaxWait != DefaultFetchMaxWait {
		t.Fatalf("DefaultConfig().FetchMaxWait = %v, want %v", cfg.FetchMaxWait, DefaultFetchMaxWait)
	}
	start(t, cfg)
	offs := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod-a", time.Now(), 1, 2)})
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, offs)

	mu.Lock()
	defer mu.Unlock()
	if len(waits) == 0 {
		t.Fatal("the broker saw no fetch")
	}
	want := int32(DefaultFetchMaxWait / time.Millisecond)
	for i, w := range waits {
		if w != want {
			t.Fatalf("fetch %d of %d asked the broker to wait %d ms, want %d", i, len(waits), w, want)
		}
	}
}

// TestWindowLingerJoinsRecords: with a WindowLinger, records that arrive
// one by one, each after the previous was fetched and applied, still
// share one window, written once with the offset after the last; without
// it each would be a window of its own. A window that fills (here at
// WindowRecords) is written at once.
func TestWindowLingerJoinsRecords(t *testing.T) {
	const topic = "linger"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	cfg := e.config(t, topic, "g-linger", "/kvindex/linger/")
	cfg.WindowLinger = time.Second
	cfg.WindowRecords = 3
	var (
		mu      sync.Mutex
		offsets []int64
	)
	cfg.BeforeTxn = func(_ context.Context, info TxnInfo) error {
		if info.Offset >= 0 {
			mu.Lock()
			offsets = append(offsets, info.Offset)
			mu.Unlock()
		}
		return nil
	}
	start(t, cfg)
	now := time.Now()
	last := ingesttest.Offsets{}
	for i := range 3 {
		// Each produce returns once the broker has the record; the
		// worker has fetched the previous one by then or soon after.
		last.Merge(ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{store(t, "pod-a", now, uint64(i+1))}))
		time.Sleep(20 * time.Millisecond)
	}
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, last)
	mu.Lock()
	got := slices.Clone(offsets)
	mu.Unlock()
	if !slices.Equal(got, []int64{3}) {
		t.Errorf("windows stored the offsets %v, want one window storing 3", got)
	}
	if n := len(ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)); n != 3 {
		t.Errorf("%d blocks, want 3", n)
	}
}

// TestLingerLeft: a window lingers until its oldest record is the linger
// old by its Kafka timestamp, never longer than the linger from now, and
// a record without a timestamp counts as arriving now.
func TestLingerLeft(t *testing.T) {
	now := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	const linger = 30 * time.Millisecond
	for _, tc := range []struct {
		name   string
		linger time.Duration
		oldest time.Time
		want   time.Duration
	}{
		{"fresh", linger, now, linger},
		{"waited_in_kafka", linger, now.Add(-12 * time.Millisecond), 18 * time.Millisecond},
		{"exactly_old", linger, now.Add(-linger), 0},
		{"backlog", linger, now.Add(-time.Hour), 0},
		{"producer_clock_ahead", linger, now.Add(time.Hour), linger},
		{"no_timestamp", linger, time.Time{}, linger},
		{"timestamp_minus_one", linger, time.UnixMilli(-1), linger},
		{"no_linger", 0, now, 0},
	} {
		if got := lingerLeft(tc.linger, tc.oldest, now); got != tc.want {
			t.Errorf("%s: lingerLeft(%v, %v) = %v, want %v", tc.name, tc.linger, tc.oldest, got, tc.want)
		}
	}
}

// TestWindowOldestRecord: a window's linger counts from the earliest
// Kafka timestamp among its records, whatever their order, and starts
// afresh once it is written.
func TestWindowOldestRecord(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	var w window
	for _, d := range []time.Duration{5, 2, 9} {
		w.noteRecord(t0.Add(d * time.Millisecond))
	}
	if want := t0.Add(2 * time.Millisecond); !w.oldest.Equal(want) || w.records != 3 {
		t.Fatalf("after 3 records: oldest %v, records %d; want %v, 3", w.oldest, w.records, want)
	}
	w.reset()
	w.noteRecord(t0.Add(time.Second))
	if want := t0.Add(time.Second); !w.oldest.Equal(want) || w.records != 1 {
		t.Fatalf("after a reset and 1 record: oldest %v, records %d; want %v, 1", w.oldest, w.records, want)
	}
}

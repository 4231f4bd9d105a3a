package indexd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// reflector keeps an index in step with etcd (DESIGN "Reads"), after
// client-go's Reflector: list the keyspace at one revision into a fresh
// index, publish it, then watch from the next revision and apply each
// revision's events under the index's write lock. It is the index's one
// writer.
//
// A broken watch (leader loss, network, etcd restart) resumes from the
// last applied revision + 1 on the same index. Only a compaction past that
// revision, or a chunk event that comes without the previous value the
// index diffs it against (errNoPrevKV), forces a re-list; the fresh index
// is swapped in atomically when complete, and the old one serves until
// then.
type reflector struct {
	cli  *clientv3.Client
	ks   keyspace.Keyspace
	cfg  Config
	log  *slog.Logger
	m    *metrics
	cur  atomic.Pointer[index.Index]
	bcst *broadcaster
	// onReady runs once, after the first list is published.
	onReady func()
	// progress is the clock's time, in Unix nanoseconds, of the last
	// proof that the index was current: a published list, a watch
	// delivery while deliveries keep coming (delivered), or a progress
	// check the index has caught up with (proof); 0 before the first
	// list.
	progress atomic.Int64
	// proof is the progress check that the index had not reached when its
	// answer came (nil: none): it counts once the watch applies its
	// revision.
	proof atomic.Pointer[progressProof]
	// listBegan is the clock's time, in Unix nanoseconds, when the list in
	// progress began (0: none), and listStep the call it waits on: the
	// monitor warns of a list etcd does not answer, which would otherwise
	// wait silently (a Get waits for a connection as long as its context).
	listBegan atomic.Int64
	listStep  atomic.Pointer[string]
}

// The list's steps, as its slow-list warning names them.
var (
	stepEndpoints = "reading endpoints/"
	stepOffsets   = "reading offsets/"
	stepChunks    = "reading chunks/"
)

// listWarnEvery is how often, in multiples of StaleLogAfter, a list that
// is still running is warned of again.
const listWarnEvery = 6

// markProgress records that the index is current as of now.
func (r *reflector) markProgress() { r.markProgressAt(r.cfg.Clock.Now()) }

// markProgressAt records that the index was current at t; progress never
// moves back.
func (r *reflector) markProgressAt(t time.Time) {
	n := t.UnixNano()
	for {
		cur := r.progress.Load()
		if cur >= n || r.progress.CompareAndSwap(cur, n) {
			return
		}
	}
}

// progressProof is a progress check's answer: etcd's revision when a
// linearizable Get sent at sent was answered. An index that has applied
// rev was current at sent.
type progressProof struct {
	rev  int64
	sent time.Time
}

// deliveryGap is the longest silence after which a watch delivery still
// counts as progress: twice the progress interval, the longest a healthy
// watch goes without a delivery or a proof (the requester checks once an
// interval has passed without either, every interval).
func (r *reflector) deliveryGap() time.Duration { return 2 * r.cfg.ProgressInterval }

// delivered records what a watch delivery, now applied to ix, proves. It
// counts as progress (current as of now) only while deliveries or proofs
// keep coming, at most deliveryGap apart. After a longer silence, what
// arrives may have waited in buffers (a process paused by SIGSTOP or
// starved of CPU reads its socket's backlog as new), so it does not count:
// a progress check sent after the silence (requestProgress) proves the
// index current once the index reaches the check's revision, and from
// then on deliveries count again. Checked either way: a pending proof the
// index has now reached.
func (r *reflector) delivered(ix *index.Index) {
	if p := r.proof.Load(); p != nil && ix.Revision() >= p.rev {
		r.markProgressAt(p.sent)
		r.proof.CompareAndSwap(p, nil)
	}
	if age := r.progressAge(); age <= r.deliveryGap() {
		r.markProgress()
	}
}

// proved records a progress check's answer (a linearizable Get answered
// at rev, sent at sent): progress at sent if ix has applied rev, else a
// pending proof that delivered counts once it has. An older check still
// pending is kept: revisions only grow, so it resolves no later.
func (r *reflector) proved(ix *index.Index, rev int64, sent time.Time) {
	if rev <= ix.Revision() {
		r.markProgressAt(sent)
		return
	}
	old := r.proof.Load()
	if old != nil && old.rev > ix.Revision() {
		return
	}
	// Lost only to delivered clearing old meanwhile; the next check sets
	// one again.
	r.proof.CompareAndSwap(old, &progressProof{rev: rev, sent: sent})
}

// progressTime is the time of the last progress, zero before the first.
func (r *reflector) progressTime() time.Time {
	if n := r.progress.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// progressAge is how long ago the last progress was, 0 before the first.
func (r *reflector) progressAge() time.Duration {
	p := r.progressTime()
	if p.IsZero() {
		return 0
	}
	return max(r.cfg.Clock.Since(p), 0)
}

// monitor logs (and counts) the moment the last progress grows older than
// StaleLogAfter, and the moment progress resumes, checking every
// ProgressInterval until ctx ends. The age itself is a gauge
// (kvindex_indexd_progress_age_seconds) read at scrape time.
func (r *reflector) monitor(ctx context.Context) {
	t := r.cfg.Clock.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	stale := false
	var warnedList int64 // listBegan of the list last warned of
	var listWarned time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if began := r.listBegan.Load(); began != 0 {
			waited := r.cfg.Clock.Since(time.Unix(0, began))
			if began != warnedList {
				warnedList, listWarned = began, 0
			}
			if waited > r.cfg.StaleLogAfter && (listWarned == 0 || waited-listWarned >= listWarnEvery*r.cfg.StaleLogAfter) {
				if listWarned == 0 {
					r.m.staleWarnings.Inc()
				}
				listWarned = waited
				step := ""
				if p := r.listStep.Load(); p != nil {
					step = *p
				}
				r.log.Warn("listing etcd is taking long: no answer yet, still waiting", "step", step,
					"waited", waited.Round(time.Millisecond), "etcd", r.cli.Endpoints(), "revision", r.revision())
			}
		}
		age := r.progressAge()
		switch {
		case !stale && age > r.cfg.StaleLogAfter:
			stale = true
			r.m.staleWarnings.Inc()
			r.log.Warn("index is stale: no progress from etcd, answering from the last state",
				"age", age.Round(time.Millisecond), "revision", r.revision(), "threshold", r.cfg.StaleLogAfter)
		case stale && age <= r.cfg.StaleLogAfter:
			stale = false
			r.log.Info("index is current again", "revision", r.revision())
		}
	}
}

// revision is the serving index's revision, 0 before the first list.
func (r *reflector) revision() int64 {
	if ix := r.current(); ix != nil {
		return ix.Revision()
	}
	return 0
}

// errWatchClosed reports a watch channel that closed without an error.
var errWatchClosed = errors.New("indexd: watch channel closed")

// current returns the serving index, or nil before the first list.
func (r *reflector) current() *index.Index { return r.cur.Load() }

// run lists and watches until ctx ends; it returns nil then. Every other
// failure is retried with backoff on the configured clock
// (backoff.Until around listAndWatch, as client-go's reflector runs
// BackoffUntil around ListAndWatch).
func (r *reflector) run(ctx context.Context) error {
	bo := backoff.New(r.cfg.BackoffMin, r.cfg.BackoffMax, r.cfg.Clock)
	st := &listWatchState{reason: "start"}
	backoff.Until(ctx, bo, func(ctx context.Context) (bool, error) {
		return r.listAndWatch(ctx, st)
	}, func(err error, d time.Duration) {
		if st.ix == nil {
			r.log.Warn("listing etcd failed, retrying", "err", err, "backoff", d)
			return
		}
		r.m.watchRestarts.Inc()
		r.log.Warn("watch broken, resuming", "revision", st.ix.Revision(), "err", err, "backoff", d)
	})
	return nil
}

// listWatchState carries the serving index from one listAndWatch to the
// next, and why the next list happens (the lists metric's label).
type listWatchState struct {
	// ix is the index being watched into, nil when the next call must list.
	ix *index.Index
	// reason labels the next list: "start", or relistReason's answer.
	reason string
}

// listAndWatch lists into a fresh index when st has none, then watches
// into it until the watch ends. It returns nil to go again at once (the
// list revision was compacted mid-list, or the watch cannot continue on
// this index and st now asks for a re-list) and an error to go again after
// a backoff (the list failed, or the watch broke and resumes from the
// index's revision); progressed is true once the watch applied something.
func (r *reflector) listAndWatch(ctx context.Context, st *listWatchState) (progressed bool, err error) {
	if st.ix == nil {
		fresh, err := r.list(ctx)
		if err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) && ctx.Err() == nil {
				// The revision we listed at was compacted mid-list:
				// start again at a newer one, no need to wait.
				r.log.Info("list revision compacted, listing again", "err", err)
				return false, nil
			}
			return false, err
		}
		st.ix = fresh
		r.cur.Store(fresh)
		r.markProgress()
		r.bcst.broadcast()
		r.m.lists.WithLabelValues(st.reason).Inc()
		if st.reason == "start" {
			r.onReady()
		}
	}
	progressed, err = r.watch(ctx, st.ix)
	if ctx.Err() != nil {
		return progressed, nil
	}
	if why, ok := relistReason(err); ok {
		r.log.Warn("watch cannot continue on this index, re-listing into a fresh one", "revision", st.ix.Revision(), "reason", why, "err", err)
		st.ix = nil
		st.reason = why
		return progressed, nil
	}
	return progressed, err
}

// list reads the keyspace at one revision into a fresh index: the small
// endpoints/ prefix first (its response header fixes the revision R), then
// offsets/ and the chunks/ keyspace at R, cut into one range per known
// endpoint (DESIGN "Reads": one ranged Get pays for the whole remaining
// range, so small pages over a big prefix are quadratic). The ranges are
// contiguous, so chunks of an endpoint with no record are read too. Up to
// ListConcurrency ranges are in flight; this goroutine applies them, each
// chunk as a put with no previous value.
func (r *reflector) list(ctx context.Context) (*index.Index, error) {
	start := time.Now()
	ix := index.New(r.ks)
	// The index is not published until the list is in: the loader queues
	// the chunks' entries as they arrive and builds the tables at the end
	// (internal/index, load.go).
	ld := ix.Loader()
	var bad []badKey
	apply := func(kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			if kind, err := ld.ApplyPut(bytesString(kv.Key), kv.Value); err != nil {
				bad = appendBad(bad, kind, kv.Key, err)
			}
		}
		r.m.listedKeys.Add(float64(len(kvs)))
	}
	r.listBegan.Store(r.cfg.Clock.Now().UnixNano())
	defer r.listBegan.Store(0)
	r.listStep.Store(&stepEndpoints)
	resp, err := r.cli.Get(ctx, r.ks.EndpointsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("listing endpoints: %w", err)
	}
	rev := resp.Header.Revision
	apply(resp.Kvs)
	r.listStep.Store(&stepOffsets)
	resp, err = r.cli.Get(ctx, r.ks.OffsetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, fmt.Errorf("listing offsets at revision %d: %w", rev, err)
	}
	apply(resp.Kvs)
	r.listStep.Store(&stepChunks)

	bounds := ix.EndpointPrefixes()
	slices.Sort(bounds)
	chunks := r.ks.ChunksPrefix()
	if len(bounds) > 0 {
		bounds[0] = chunks // the first range starts at the section
	} else {
		bounds = append(bounds, chunks)
	}
	bounds = append(bounds, keyspace.RangeEnd(chunks))

	results := make(chan []*mvccpb.KeyValue, r.cfg.ListConcurrency)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.ListConcurrency)
	feeder := make(chan error, 1)
	go func() {
		// The feeder owns results: it closes it once every range is in.
		defer close(results)
		for i := 0; i+1 < len(bounds); i++ {
			from, to := bounds[i], bounds[i+1]
			g.Go(func() error {
				resp, err := r.cli.Get(gctx, from, clientv3.WithRange(to), clientv3.WithRev(rev))
				if err != nil {
					return fmt.Errorf("listing chunks [%s, %s) at revision %d: %w", from, to, rev, err)
				}
				select {
				case results <- resp.Kvs:
					return nil
				case <-gctx.Done():
					return gctx.Err()
				}
			})
		}
		feeder <- g.Wait()
	}()
	// waited is how long this goroutine waited for etcd: most of the
	// list when reading bounds it, little when building the index does.
	var waited time.Duration
	for {
		w := time.Now()
		kvs, ok := <-results
		waited += time.Since(w)
		if !ok {
			break
		}
		apply(kvs)
	}
	if err := <-feeder; err != nil {
		return nil, err
	}
	built := time.Now()
	if err := ld.Finish(); err != nil {
		bad = appendBad(bad, keyspace.KindChunk, []byte(chunks), err)
	}
	ix.Write(rev, func() {})
	r.logBad(bad, "listing")
	st := ix.Stats()
	d := time.Since(start)
	r.m.listSeconds.Observe(d.Seconds())
	r.log.Info("index listed", "revision", rev, "entries", st.Entries, "endpoints", st.Endpoints,
		"ranges", len(bounds)-1, "seconds", d.Seconds(), "read_wait_seconds", waited.Seconds(),
		"build_seconds", time.Since(built).Seconds())
	if st.Duplicates > 0 {
		r.log.Warn("chunks hold key hashes another chunk of their endpoint and tier holds too; served once each, and repaired when the ingester next rebuilds the endpoint (kvindex inspect chunks names them)",
			"revision", rev, "duplicate_holds", st.Duplicates)
	}
	return ix, nil
}

// watch applies the watch from ix's revision + 1 until it breaks, and
// returns why, and whether any response arrived. The watch asks for each
// event's previous value (WithPrevKV): a chunk put is applied as the
// difference from it (internal/index, chunks.go). While it runs it asks
// etcd for a progress notification every ProgressInterval (etcd's own
// come every 10 minutes), so a healthy idle watch still proves itself
// current and a silent one shows as a growing progress age.
func (r *reflector) watch(ctx context.Context, ix *index.Index) (bool, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	from := ix.Revision() + 1
	wch := r.cli.Watch(wctx, r.ks.Prefix(), clientv3.WithPrefix(), clientv3.WithRev(from),
		clientv3.WithProgressNotify(), clientv3.WithFragment(), clientv3.WithPrevKV())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.requestProgress(wctx, ix)
	}()
	// The requester stops with the watch, and is waited for.
	defer func() {
		cancel()
		wg.Wait()
	}()
	progressed := false
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return progressed, err
		}
		progressed = true
		if resp.IsProgressNotify() {
			// Every event up to the header's revision has been delivered.
			ix.Write(resp.Header.Revision, func() {})
			r.delivered(ix)
			continue
		}
		if err := r.apply(ix, resp.Events); err != nil {
			return progressed, err
		}
		r.delivered(ix)
	}
	return progressed, errWatchClosed
}

// errNoPrevKV reports a watched chunk event without the previous value
// the index must diff it against: a delete, or a put that did not create
// its key, that came without prev_kv. etcd leaves prev_kv out only when
// it cannot read the key at the event's revision - 1, which happens when
// a compaction overtakes a watcher that is catching up. The index keeps
// no chunk state to diff against instead, so the reflector stops before
// that revision and re-lists (reason "prev_kv_missing").
var errNoPrevKV = errors.New("indexd: a chunk event came without its previous value")

// relistReason says whether a watch error needs a fresh index, and the
// lists_total reason to count it under.
func relistReason(err error) (string, bool) {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return "compacted", true
	case errors.Is(err, errNoPrevKV):
		return "prev_kv_missing", true
	}
	return "", false
}

// needsPrev reports whether ev is a chunk event that the index cannot
// apply without a previous value it did not get.
func (r *reflector) needsPrev(ev *clientv3.Event) bool {
	return ev.PrevKv == nil && !ev.IsCreate() && r.ks.KindOf(bytesString(ev.Kv.Key)) == keyspace.KindChunk
}

// requestProgress proves the watch current every ProgressInterval in
// which no event or notification did, until ctx ends (ctx carries the
// watch's metadata, which names its stream). Two ways, because etcd sends
// a requested progress notification only when the watch is synced and
// the store has reached its start revision, which an idle keyspace never
// does (the watch starts at the listed revision + 1):
//
//   - Watcher.RequestProgress: a notification that comes back is a
//     delivery (delivered) that brings the index to its revision;
//   - a linearizable count-only Get (proved): once the index has applied
//     its revision, the index was current when the Get was sent. This is
//     the proof that still counts after a silence, when deliveries do not.
//
// A failed attempt is retried at the next tick; the watch's own error, if
// any, ends the watch.
func (r *reflector) requestProgress(ctx context.Context, ix *index.Index) {
	t := r.cfg.Clock.NewTicker(r.cfg.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if r.progressAge() < r.cfg.ProgressInterval {
			continue
		}
		if err := r.cli.RequestProgress(ctx); err != nil && ctx.Err() == nil {
			r.log.Debug("requesting watch progress failed", "err", err)
		}
		sent := r.cfg.Clock.Now()
		gctx, cancel := context.WithTimeout(ctx, r.checkTimeout())
		resp, err := r.cli.Get(gctx, r.ks.Prefix(), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Debug("checking watch progress failed", "err", err)
			}
			continue
		}
		r.proved(ix, resp.Header.Revision, sent)
	}
}

// checkTimeout bounds one progress check's Get: two progress intervals
// (the next check is due by then), at least 500 ms and at most 2 s: long
// enough for a loaded etcd, short enough that a dead one does not delay
// the next check much.
func (r *reflector) checkTimeout() time.Duration {
	return min(max(2*r.cfg.ProgressInterval, 500*time.Millisecond), 2*time.Second)
}

// apply applies events, one revision at a time: each revision's events
// under one hold of the write lock, so readers see whole revisions only,
// and in any order within it (the index's chunk holds are counted, so the
// events of one revision commute). A revision with a chunk event that
// lacks its previous value is not applied: apply returns errNoPrevKV
// wrapped, with every revision before it applied.
func (r *reflector) apply(ix *index.Index, events []*clientv3.Event) error {
	var counts [keyspace.KindCount]int
	var bad []badKey
	for i := 0; i < len(events); {
		rev := events[i].Kv.ModRevision
		j := i + 1
		for j < len(events) && events[j].Kv.ModRevision == rev {
			j++
		}
		for _, ev := range events[i:j] {
			if r.needsPrev(ev) {
				r.countEvents(counts)
				r.logBad(bad, "watch")
				return fmt.Errorf("%w: %s %q at revision %d", errNoPrevKV, ev.Type, ev.Kv.Key, rev)
			}
		}
		offsets := false
		ix.Write(rev, func() {
			for _, ev := range events[i:j] {
				var kind keyspace.Kind
				var err error
				var prev []byte
				if ev.PrevKv != nil {
					prev = ev.PrevKv.Value
				}
				if ev.Type == mvccpb.DELETE {
					kind, err = ix.ApplyDelete(bytesString(ev.Kv.Key), prev)
				} else {
					kind, err = ix.ApplyPut(bytesString(ev.Kv.Key), prev, ev.Kv.Value)
				}
				counts[kind]++
				offsets = offsets || kind == keyspace.KindOffset
				if err != nil {
					bad = appendBad(bad, kind, ev.Kv.Key, err)
				}
			}
		})
		if offsets {
			r.bcst.broadcast()
		}
		i = j
	}
	r.countEvents(counts)
	r.logBad(bad, "watch")
	return nil
}

// countEvents adds applied watch events, by kind, to watch_events_total.
func (r *reflector) countEvents(counts [keyspace.KindCount]int) {
	for kind, n := range counts {
		if n > 0 {
			r.m.watchEvents.WithLabelValues(keyspace.Kind(kind).String()).Add(float64(n))
		}
	}
}

// badKey is a key the index could not use.
type badKey struct {
	kind keyspace.Kind
	key  string
	err  error
}

// maxBadLogged bounds the malformed keys logged one by one per list or
// watch response; the rest are counted and summarised.
const maxBadLogged = 10

func appendBad(bad []badKey, kind keyspace.Kind, key []byte, err error) []badKey {
	return append(bad, badKey{kind: kind, key: string(key), err: err})
}

func (r *reflector) logBad(bad []badKey, phase string) {
	for i, b := range bad {
		r.m.malformed.WithLabelValues(b.kind.String()).Inc()
		if i < maxBadLogged {
			r.log.Warn("skipping key the index cannot use", "phase", phase, "kind", b.kind.String(), "key", b.key, "err", b.err)
		}
	}
	if len(bad) > maxBadLogged {
		r.log.Warn("skipped more keys the index cannot use", "phase", phase, "count", len(bad)-maxBadLogged)
	}
}

// bytesString views b as a string without copying. Only for keys the index
// reads and does not keep (it clones what it keeps, see index.Index.Put):
// listing reads millions of keys, and a copy each is measurable.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

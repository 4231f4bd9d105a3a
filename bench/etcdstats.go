package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// dbSize is an etcd member's database size as its Maintenance Status API
// reports it: Size is dbSize, the bbolt file's size; InUse is
// dbSizeInUse, that size less the free pages (what the data occupies).
type dbSize struct {
	Size, InUse int64
}

// backendSettle is how long dbSizeOf waits before it reads the sizes: etcd
// commits its backend every 100 ms (--backend-batch-interval's default),
// and the sizes count committed pages only.
const backendSettle = 250 * time.Millisecond

// dbSizeOf reads the database size of n's member once the writes before
// the call are committed to its backend (backendSettle).
func dbSizeOf(ctx context.Context, n *etcdNode) (dbSize, error) {
	t := time.NewTimer(backendSettle)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return dbSize{}, ctx.Err()
	}
	st, err := n.cli.Status(ctx, n.endpoints[0])
	if err != nil {
		return dbSize{}, fmt.Errorf("bench: etcd status: %w", err)
	}
	return dbSize{Size: st.DbSize, InUse: st.DbSizeInUse}, nil
}

// growth is the database's growth from s to later.
func (s dbSize) growth(later dbSize) dbSize {
	return dbSize{Size: later.Size - s.Size, InUse: later.InUse - s.InUse}
}

// watchCounter is a dedicated watcher of a prefix that counts what etcd
// sends it: the events and, as their bytes, the protobuf size of each
// event's KeyValue (proto.Size of the mvccpb.KeyValue: key, value,
// revisions, version, lease), what every watcher of the prefix (each indexd
// replica) receives per event, framing aside.
type watchCounter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	bytes, events atomic.Int64
	// seen is the highest revision the watcher is known to have every
	// event up to: an event's ModRevision, or a progress notification's
	// header revision.
	seen atomic.Int64

	mu  sync.Mutex
	err error
}

// startWatchCounter watches prefix on cli from revision from on; stop
// ends it. cli must be the counter's own client (waitRevision asks cli's
// watch streams for progress).
func startWatchCounter(ctx context.Context, cli *clientv3.Client, prefix string, from int64) *watchCounter {
	wctx, cancel := context.WithCancel(ctx)
	w := &watchCounter{cancel: cancel}
	w.seen.Store(from - 1)
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for wr := range wch {
			if err := wr.Err(); err != nil {
				w.fail(err)
				return
			}
			if wr.IsProgressNotify() {
				w.advance(wr.Header.Revision)
				continue
			}
			for _, ev := range wr.Events {
				w.events.Add(1)
				w.bytes.Add(int64(proto.Size(ev.Kv)))
				w.advance(ev.Kv.ModRevision)
			}
		}
	}()
	return w
}

func (w *watchCounter) advance(rev int64) {
	for {
		cur := w.seen.Load()
		if rev <= cur || w.seen.CompareAndSwap(cur, rev) {
			return
		}
	}
}

func (w *watchCounter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

// waitRevision waits until the watcher has received every event up to
// rev, asking etcd for a progress notification every 20 ms (which etcd
// sends once the watcher has caught up), or until ctx ends or the watch
// failed.
func (w *watchCounter) waitRevision(ctx context.Context, cli *clientv3.Client, rev int64) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for w.seen.Load() < rev {
		w.mu.Lock()
		err := w.err
		w.mu.Unlock()
		if err != nil {
			return fmt.Errorf("bench: watch counter: %w", err)
		}
		if err := cli.RequestProgress(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("bench: watch counter progress: %w", err)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stop ends the watch and waits for its goroutine.
func (w *watchCounter) stop() {
	w.cancel()
	w.wg.Wait()
}

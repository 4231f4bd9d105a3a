package ingester

import (
	"context"
	"log/slog"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/backoff"
)

// keeper is the lease manager's keep-alive: it keeps a set of leases alive
// over one LeaseKeepAlive stream, renewing each at a third of the TTL
// (DESIGN "Writes: leases"). The manager adds the leases it grants or
// adopts and removes them when they are revoked or their partition goes; a
// lease etcd reports expired leaves the set (a later write that needs it
// re-grants) and closes its watch channel, if any.
//
// It uses real time, not Config.Clock: etcd expires leases in real time.
type keeper struct {
	lc       pb.LeaseClient
	interval time.Duration
	log      *slog.Logger
	m        *metrics

	mu   sync.Mutex
	refs map[clientv3.LeaseID]int // lease -> number of holders
	// lost are the watch channels of watched leases, closed (and removed)
	// when etcd reports the lease expired.
	lost map[clientv3.LeaseID]chan struct{}
	// kick is signalled when leases are added, so adopted leases are
	// renewed at once rather than up to interval later.
	kick chan struct{}
}

func newKeeper(cli *clientv3.Client, ttl time.Duration, log *slog.Logger, m *metrics) *keeper {
	return &keeper{
		lc:       pb.NewLeaseClient(cli.ActiveConnection()),
		interval: ttl / 3,
		log:      log,
		m:        m,
		refs:     make(map[clientv3.LeaseID]int),
		lost:     make(map[clientv3.LeaseID]chan struct{}),
		kick:     make(chan struct{}, 1),
	}
}

// add starts keeping freshly granted ids alive (first renewal within a
// third of the TTL).
func (k *keeper) add(ids ...clientv3.LeaseID) { k.hold(false, ids) }

// adopt starts keeping ids of a predecessor alive, renewing them at once:
// they may have little of their TTL left.
func (k *keeper) adopt(ids ...clientv3.LeaseID) { k.hold(true, ids) }

func (k *keeper) hold(now bool, ids []clientv3.LeaseID) {
	if len(ids) == 0 {
		return
	}
	k.mu.Lock()
	for _, id := range ids {
		if id != 0 {
			k.refs[id]++
		}
	}
	k.m.leases.Set(float64(len(k.refs)))
	k.mu.Unlock()
	if now {
		select {
		case k.kick <- struct{}{}:
		default:
		}
	}
}

// remove stops keeping ids alive (once every holder removed them).
func (k *keeper) remove(ids ...clientv3.LeaseID) {
	k.mu.Lock()
	for _, id := range ids {
		if n, ok := k.refs[id]; ok {
			if n <= 1 {
				delete(k.refs, id)
				delete(k.lost, id)
			} else {
				k.refs[id] = n - 1
			}
		}
	}
	k.m.leases.Set(float64(len(k.refs)))
	k.mu.Unlock()
}

func (k *keeper) snapshot(dst []clientv3.LeaseID) []clientv3.LeaseID {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id := range k.refs {
		dst = append(dst, id)
	}
	return dst
}

// watch returns a channel closed when etcd reports id expired while it is
// kept alive.
func (k *keeper) watch(id clientv3.LeaseID) <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	ch := k.lost[id]
	if ch == nil {
		ch = make(chan struct{})
		k.lost[id] = ch
	}
	return ch
}

func (k *keeper) expired(id clientv3.LeaseID) {
	k.mu.Lock()
	_, ok := k.refs[id]
	delete(k.refs, id)
	if ch := k.lost[id]; ch != nil {
		close(ch)
		delete(k.lost, id)
	}
	k.m.leases.Set(float64(len(k.refs)))
	k.mu.Unlock()
	if ok {
		k.m.leasesExpired.Inc()
		k.log.Warn("lease expired while kept alive", "lease", keyspaceLease(id))
	}
}

// run renews the leases until ctx ends, reopening the stream after errors.
func (k *keeper) run(ctx context.Context) error {
	bo := backoff.New(50*time.Millisecond, max(k.interval/2, 50*time.Millisecond), nil)
	for ctx.Err() == nil {
		err := k.stream(ctx)
		if ctx.Err() != nil {
			break
		}
		d := bo.Next()
		k.log.Warn("lease keepalive stream failed; reopening", "err", err, "backoff", d)
		_ = backoff.Sleep(ctx, nil, d)
	}
	return nil
}

// stream runs one keepalive stream until it fails or ctx ends.
func (k *keeper) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	st, err := k.lc.LeaseKeepAlive(sctx)
	if err != nil {
		return err
	}
	recvErr := make(chan error, 1) // written once by the receiver below
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			resp, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if resp.TTL <= 0 {
				k.expired(clientv3.LeaseID(resp.ID))
			}
		}
	}()
	defer wg.Wait()
	defer cancel()
	tick := time.NewTicker(k.interval)
	defer tick.Stop()
	var ids []clientv3.LeaseID
	for {
		ids = k.snapshot(ids[:0])
		for _, id := range ids {
			if err := st.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-tick.C:
		case <-k.kick:
		}
	}
}

package indexd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/index/indextest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// stream writes random transactions the way the ingester does and keeps a
// reference model of what etcd holds.
type stream struct {
	t    *testing.T
	rng  *rand.Rand
	w    *writer
	ref  *indextest.Reference
	pool []uint64
	eps  []keyspace.Endpoint
}

func newStream(t *testing.T, w *writer, seed uint64) *stream {
	s := &stream{t: t, rng: rand.New(rand.NewPCG(seed, 11)), w: w, ref: indextest.NewReference()}
	// Small chunks, so that the 16 hashes fill several per (endpoint,
	// tier) and removals merge them, and each transaction's chunk ops in
	// a random order.
	w.chunks.Size, w.chunks.MergeBelow = 4, 2
	w.shuffle = rand.New(rand.NewPCG(seed, 13))
	for range 16 {
		s.pool = append(s.pool, s.rng.Uint64())
	}
	for _, m := range testModels {
		for _, p := range testPods[:5] {
			for r := range uint32(2) {
				s.eps = append(s.eps, keyspace.Endpoint{Model: m, Pod: p, Rank: r})
			}
		}
	}
	return s
}

// step commits n random transactions.
func (s *stream) step(n int) {
	for range n {
		ep := s.eps[s.rng.IntN(len(s.eps))]
		switch r := s.rng.IntN(100); {
		case r < 4: // a range drop, alone in its transaction
			s.w.commit(s.w.drop(ep))
			for b := range s.ref.Present {
				if b.Endpoint == ep {
					delete(s.ref.Present, b)
				}
			}
		case r < 8:
			if s.rng.IntN(2) == 0 {
				s.w.commit(s.w.record(ep, keyspace.EndpointRecord{BlockSize: 16, LastRecord: time.Unix(1700000000, 0).UTC()}))
				s.ref.Records[ep] = true
			} else {
				s.w.commit(clientv3.OpDelete(s.w.ks.EndpointKey(ep)))
				delete(s.ref.Records, ep)
			}
		default: // a batch of block puts and deletes, last op per key wins
			last := map[keyspace.Block]bool{}
			for range 1 + s.rng.IntN(24) {
				b := keyspace.Block{Endpoint: s.eps[s.rng.IntN(len(s.eps))], Tier: tier.All[s.rng.IntN(tier.Count)], Hash: s.pool[s.rng.IntN(len(s.pool))]}
				last[b] = s.rng.IntN(100) < 65
			}
			var ops []any
			for b, put := range last {
				if put {
					ops = append(ops, s.w.put(b))
					s.ref.Present[b] = true
				} else {
					ops = append(ops, s.w.del(b))
					delete(s.ref.Present, b)
				}
			}
			s.w.commit(ops...)
		}
	}
}

// check compares a replica with the reference after the last commit.
func (s *stream) check(r *replica) {
	s.t.Helper()
	for _, model := range testModels {
		for q := range 12 {
			hashes := s.pool
			if q > 0 {
				hashes = make([]uint64, 1+s.rng.IntN(len(s.pool)))
				for i, j := range s.rng.Perm(len(s.pool))[:len(hashes)] {
					hashes[i] = s.pool[j]
				}
			}
			var cands []keyspace.Endpoint
			if q%4 == 3 {
				cands = []keyspace.Endpoint{s.eps[s.rng.IntN(len(s.eps))], s.eps[s.rng.IntN(len(s.eps))]}
			}
			got, _ := lookup(s.t, r, s.w, model, hashes, cands)
			if diff := gocmp.Diff(s.ref.Lookup(model, hashes, cands), got, cmpopts.EquateEmpty()); diff != "" {
				s.t.Fatalf("Lookup(%s, %x, %v) (-reference +indexd):\n%s", model, hashes, cands, diff)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{})
	if err != nil {
		s.t.Fatal(err)
	}
	var got []index.EndpointInfo
	for _, e := range resp.Endpoints {
		got = append(got, index.EndpointInfo{
			Endpoint: keyspace.Endpoint{Model: e.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.DpRank},
			Blocks:   [tier.Count]uint64{e.GpuBlocks, e.CpuBlocks, e.DiskBlocks},
			Record:   e.LastSeen != nil,
		})
	}
	if diff := gocmp.Diff(s.ref.Endpoints(""), got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(index.EndpointInfo{}, "LastSeen", "BlockSize", "Partition")); diff != "" {
		s.t.Fatalf("ListEndpoints (-reference +indexd):\n%s", diff)
	}
}

// sameAnswers checks that two replicas give identical responses.
func sameAnswers(t *testing.T, a, b *replica, s *stream) {
	t.Helper()
	for _, model := range testModels {
		_, ra := lookup(t, a, s.w, model, s.pool, nil)
		_, rb := lookup(t, b, s.w, model, s.pool, nil)
		if diff := gocmp.Diff(ra, rb, protocmp.Transform(), protocmp.IgnoreFields(&kvindexv1.LookupResponse{}, "progress_time")); diff != "" {
			t.Fatalf("replicas disagree on %s (-a +b):\n%s", model, diff)
		}
	}
}

func TestListWatchRandomStream(t *testing.T) {
	seed := testutil.Seed(t)
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	s := newStream(t, w, seed)
	s.step(20) // state before the first replica lists

	a := startReplica(t, e.Client)
	a.waitServing(t)
	s.step(60) // a follows by watch
	s.check(a)

	b := startReplica(t, e.Client) // lists mid-stream
	b.waitServing(t)
	s.step(60)
	s.check(a)
	s.check(b)
	sameAnswers(t, a, b, s)

	// Restart a replica mid-stream: the new one lists what the old one
	// had watched.
	a.stop()
	s.step(40)
	a2 := startReplica(t, e.Client)
	a2.waitServing(t)
	s.step(20)
	s.check(a2)
	s.check(b)
	sameAnswers(t, a2, b, s)

	// The reference is what etcd holds.
	if diff := gocmp.Diff(s.ref, etcdState(t, e.Client), cmpopts.EquateEmpty(), cmpopts.IgnoreFields(indextest.Reference{}, "Offsets")); diff != "" {
		t.Fatalf("reference differs from etcd (-reference +etcd):\n%s", diff)
	}
	for _, r := range []*replica{a2, b} {
		if n := r.counter(t, r.srv.m.lists.WithLabelValues("compacted")); n != 0 {
			t.Fatalf("replica re-listed %v times with no compaction", n)
		}
	}
}

func TestEtcdRestartResumesWatchWithoutRelist(t *testing.T) {
	// Both clients dial etcd through proxies, so the restarted etcd can
	// listen on a new port (port 0) and each client still finds it at the
	// address it dialed.
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	wpx := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	w := newWriter(t, ownClient(t, []string{wpx.Endpoint()}))
	s := newStream(t, w, 1)
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}))
	r.waitServing(t)
	s.step(20)
	s.check(r)

	// etcd goes away (indexd's connection breaks first, as it would when
	// the process dies), and comes back on the same data dir.
	px.Cut()
	wpx.Cut()
	e.Stop()
	e = testutil.RestartEtcd(t, e.Dir)
	px.Restore(e.Endpoints[0])
	wpx.Restore(e.Endpoints[0])
	s.step(20) // the writer's client reconnects too
	s.check(r)
	if n := r.counter(t, r.srv.m.lists.WithLabelValues("start")); n != 1 {
		t.Fatalf("lists at start = %v, want 1", n)
	}
	if n := r.counter(t, r.srv.m.lists.WithLabelValues("compacted")); n != 0 {
		t.Fatalf("an etcd restart caused %v re-lists, want 0", n)
	}
	r.stop() // before the cleanups stop etcd, so no watch holds it open
}

func TestCompactionWhileDisconnectedForcesRelist(t *testing.T) {
	e := testutil.StartEtcd(t)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	w := newWriter(t, e.Client)
	s := newStream(t, w, 2)
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}))
	r.waitServing(t)
	s.step(30)
	s.check(r)

	// Partition indexd from etcd, change and compact, then heal.
	px.Cut()
	for _, ep := range s.eps[:4] {
		s.w.commit(s.w.drop(ep)) // deletes indexd must not keep as stale entries
		for b := range s.ref.Present {
			if b.Endpoint == ep {
				delete(s.ref.Present, b)
			}
		}
	}
	s.step(20)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	resp, err := e.Client.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	px.Restore(testutil.HostPort(e.Endpoints[0]))

	s.check(r) // the barrier waits for the re-list
	if n := r.counter(t, r.srv.m.lists.WithLabelValues("compacted")); n != 1 {
		t.Fatalf("re-lists after compaction = %v, want 1", n)
	}
	s.step(10) // and the watch goes on from the fresh index
	s.check(r)
	r.stop()
}

// TestApplyWithoutPrevKV feeds the reflector's apply watched chunk events
// with and without their previous values: a put that creates its key
// needs none; a put over an existing key or a delete that comes without
// one stops apply before its revision (the index keeps no chunk state to
// diff against) with errNoPrevKV, which re-lists.
func TestApplyWithoutPrevKV(t *testing.T) {
	ks := keyspace.Default()
	ep := keyspace.Endpoint{Model: model, Pod: "p"}
	key := []byte(ks.ChunkKey(ep, tier.GPU, 0))
	value := func(keys ...uint64) []byte {
		var es []keyspace.ChunkEntry
		for _, k := range keys {
			es = append(es, keyspace.ChunkEntry{Key: k, Engine: k})
		}
		return keyspace.AppendChunkValue(nil, es, false)
	}
	created := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: key, Value: value(1, 2), CreateRevision: 5, ModRevision: 5}}
	for _, tc := range []struct {
		name    string
		ev      *clientv3.Event
		wantErr bool
		want    []uint64 // the keys held after apply
		wantRev int64
	}{
		{"put_with_prev", &clientv3.Event{Type: clientv3.EventTypePut,
			Kv:     &mvccpb.KeyValue{Key: key, Value: value(1, 3), CreateRevision: 5, ModRevision: 6},
			PrevKv: &mvccpb.KeyValue{Key: key, Value: value(1, 2), CreateRevision: 5, ModRevision: 5}}, false, []uint64{1, 3}, 6},
		{"delete_with_prev", &clientv3.Event{Type: clientv3.EventTypeDelete,
			Kv:     &mvccpb.KeyValue{Key: key, ModRevision: 6},
			PrevKv: &mvccpb.KeyValue{Key: key, Value: value(1, 2), CreateRevision: 5, ModRevision: 5}}, false, nil, 6},
		{"put_without_prev", &clientv3.Event{Type: clientv3.EventTypePut,
			Kv: &mvccpb.KeyValue{Key: key, Value: value(1, 3), CreateRevision: 5, ModRevision: 6}}, true, []uint64{1, 2}, 5},
		{"delete_without_prev", &clientv3.Event{Type: clientv3.EventTypeDelete,
			Kv: &mvccpb.KeyValue{Key: key, ModRevision: 6}}, true, []uint64{1, 2}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &reflector{ks: ks, log: logging.Discard(), bcst: newBroadcaster()}
			r.m = newMetrics(nil, r.current, func() float64 { return 0 })
			ix := index.New(ks)
			err := r.apply(ix, []*clientv3.Event{created, tc.ev})
			if got := errors.Is(err, errNoPrevKV); got != tc.wantErr {
				t.Fatalf("apply error = %v, want errNoPrevKV: %v", err, tc.wantErr)
			}
			if why, ok := relistReason(err); tc.wantErr && (!ok || why != "prev_kv_missing") {
				t.Fatalf("relistReason(%v) = %q, %v; want a re-list", err, why, ok)
			}
			var held []uint64
			for _, h := range []uint64{1, 2, 3} {
				var sc index.Scratch
				ix.Lookup(&sc, model, []uint64{h}, nil)
				if len(sc.Matches) == 1 {
					held = append(held, h)
				}
			}
			if diff := gocmp.Diff(tc.want, held); diff != "" || ix.Revision() != tc.wantRev {
				t.Fatalf("after apply: revision %d (want %d), keys (-want +got):\n%s", ix.Revision(), tc.wantRev, diff)
			}
		})
	}
}

func TestRelistReason(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
		ok   bool
	}{
		{rpctypes.ErrCompacted, "compacted", true},
		{fmt.Errorf("watch: %w", rpctypes.ErrCompacted), "compacted", true},
		{fmt.Errorf("%w: DELETE", errNoPrevKV), "prev_kv_missing", true},
		{errWatchClosed, "", false},
		{context.Canceled, "", false},
	} {
		if why, ok := relistReason(tc.err); why != tc.want || ok != tc.ok {
			t.Errorf("relistReason(%v) = %q, %v; want %q, %v", tc.err, why, ok, tc.want, tc.ok)
		}
	}
}

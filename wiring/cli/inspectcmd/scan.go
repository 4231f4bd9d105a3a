package inspectcmd

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// scanner reads the keyspace at one revision, in pages, one small range
// at a time: the endpoints/ range (or a model's or pod's part of it),
// then each endpoint's own chunks/ range. A limited Get over a big
// prefix costs etcd the whole remaining range per page (DESIGN "Reads"),
// so no read here spans more than one endpoint's chunks.
type scanner struct {
	kv          clientv3.KV
	ks          keyspace.Keyspace
	rev         int64
	page        int
	concurrency int
	// readTimeout bounds each read (--etcd-dial-timeout): an etcd that
	// stops answering fails the command then, not at --timeout.
	readTimeout time.Duration
}

// read bounds one etcd read by s.readTimeout (none when 0).
func (s *scanner) read(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.readTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.readTimeout)
}

// problem is a key the listing could not use: a malformed key or value.
type problem struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

// chunk is one parsed chunk.
type chunk struct {
	Tier    tier.Tier
	Seq     uint64
	Lease   int64
	Engine  bool
	Entries []keyspace.ChunkEntry
}

// endpointScan is one endpoint record and, when read, its chunks.
type endpointScan struct {
	Endpoint keyspace.Endpoint
	// Record is nil when the record does not decode (see Problems).
	Record    *keyspace.EndpointRecord
	ChunkNext map[string]uint64
	Lease     int64
	Chunks    []chunk
	Problems  []problem
}

// start fixes the revision of every later read with one read of the
// endpoints/ section's count.
func (s *scanner) start(ctx context.Context) error {
	ctx, cancel := s.read(ctx)
	defer cancel()
	resp, err := s.kv.Get(ctx, s.ks.EndpointsPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("reading etcd: %w", err)
	}
	s.rev = resp.Header.Revision
	return nil
}

// each calls fn for every key under prefix, in key order, page by page.
func (s *scanner) each(ctx context.Context, prefix string, fn func(*mvccpb.KeyValue)) error {
	end := keyspace.RangeEnd(prefix)
	key := prefix
	for {
		rctx, cancel := s.read(ctx)
		resp, err := s.kv.Get(rctx, key, clientv3.WithRange(end), clientv3.WithLimit(int64(s.page)), clientv3.WithRev(s.rev))
		cancel()
		if err != nil {
			return fmt.Errorf("reading %q: %w", prefix, err)
		}
		for _, kv := range resp.Kvs {
			fn(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// count is the number of keys under prefix.
func (s *scanner) count(ctx context.Context, prefix string) (int64, error) {
	ctx, cancel := s.read(ctx)
	defer cancel()
	resp, err := s.kv.Get(ctx, prefix, clientv3.WithRange(keyspace.RangeEnd(prefix)), clientv3.WithCountOnly(), clientv3.WithRev(s.rev))
	if err != nil {
		return 0, fmt.Errorf("counting %q: %w", prefix, err)
	}
	return resp.Count, nil
}

// recordNext is the part of an endpoint record the keyspace package may
// not decode yet: chunk_next, the next chunk sequence per tier.
type recordNext struct {
	ChunkNext map[string]uint64 `json:"chunk_next"`
}

// endpoints lists the endpoint records under prefix (EndpointsPrefix, a
// model's or a pod's part of it).
func (s *scanner) endpoints(ctx context.Context, prefix string) ([]*endpointScan, []problem, error) {
	var out []*endpointScan
	var probs []problem
	err := s.each(ctx, prefix, func(kv *mvccpb.KeyValue) {
		ep, err := s.ks.ParseEndpointKey(string(kv.Key))
		if err != nil {
			probs = append(probs, problem{Key: string(kv.Key), Error: err.Error()})
			return
		}
		e := &endpointScan{Endpoint: ep, Lease: kv.Lease}
		rec, err := keyspace.UnmarshalEndpointRecord(kv.Value)
		if err != nil {
			e.Problems = append(e.Problems, problem{Key: string(kv.Key), Error: err.Error()})
		} else {
			e.Record = &rec
			var next recordNext
			if json.Unmarshal(kv.Value, &next) == nil {
				e.ChunkNext = next.ChunkNext
			}
		}
		out = append(out, e)
	})
	return out, probs, err
}

// chunks reads the chunks under prefix (an endpoint's, or a pod's over
// its ranks), in key order, which is sequence order per (rank, tier).
// Keys and values that do not parse are problems.
func (s *scanner) chunks(ctx context.Context, prefix string) (map[keyspace.Endpoint][]chunk, []problem, error) {
	out := map[keyspace.Endpoint][]chunk{}
	var probs []problem
	err := s.each(ctx, prefix, func(kv *mvccpb.KeyValue) {
		c, err := s.ks.ParseChunkKey(string(kv.Key))
		if err != nil {
			probs = append(probs, problem{Key: string(kv.Key), Error: err.Error()})
			return
		}
		view, err := keyspace.ParseChunkValue(kv.Value)
		if err != nil {
			probs = append(probs, problem{Key: string(kv.Key), Error: err.Error()})
			return
		}
		out[c.Endpoint] = append(out[c.Endpoint], chunk{Tier: c.Tier, Seq: c.Seq, Lease: kv.Lease, Engine: view.HasEngine(), Entries: view.AppendEntries(nil)})
	})
	for ep, cs := range out {
		slices.SortStableFunc(cs, func(a, b chunk) int { return cmp.Or(cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Seq, b.Seq)) })
		out[ep] = cs
	}
	return out, probs, err
}

// fill reads each endpoint's chunks, up to s.concurrency ranges at once.
func (s *scanner) fill(ctx context.Context, eps []*endpointScan) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	for _, e := range eps {
		g.Go(func() error {
			cs, probs, err := s.chunks(gctx, s.ks.EndpointChunksPrefix(e.Endpoint))
			e.Chunks, e.Problems = cs[e.Endpoint], append(e.Problems, probs...)
			return err
		})
	}
	return g.Wait()
}

// podChunksPrefix is the prefix of every chunk of pod's ranks.
func podChunksPrefix(ks keyspace.Keyspace, model, pod string) string {
	return strings.TrimSuffix(ks.EndpointChunksPrefix(keyspace.Endpoint{Model: model, Pod: pod}), "0/")
}

// podEndpointsPrefix is the prefix of every endpoint record of pod.
func podEndpointsPrefix(ks keyspace.Keyspace, model, pod string) string {
	return strings.TrimSuffix(ks.EndpointKey(keyspace.Endpoint{Model: model, Pod: pod}), "0")
}

package bench

// The v1 keyspace layout, kept here as the reference the v2 figures are
// held against (the ceiling, the DB growth and the cold start of v2
// against v1 in the same run). Nothing outside this package writes or
// reads it (the migrate package keeps its own): one key per (block,
// endpoint, tier),
//
//	{prefix}blocks/{model}/{pod}/{rank}/{tier}/{hash:016x}
//
// with an empty value in engine-hash mode and the engine hash as 16 hex
// digits in token mode, each on its (endpoint, tier)'s lease, as the v1
// ingester wrote them.

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// v1Section is the v1 block section under a keyspace's prefix.
const v1Section = "blocks/"

// v1EngineHashLen is the length of a v1 token-mode block value.
const v1EngineHashLen = 16

// v1BlocksPrefix is the prefix of every v1 block key under ks.
func v1BlocksPrefix(ks keyspace.Keyspace) string { return ks.Prefix() + v1Section }

// v1EndpointPrefix is ep's v1 block prefix: blocks/{model}/{pod}/{rank}/,
// its segments escaped with url.PathEscape as every keyspace does.
func v1EndpointPrefix(ks keyspace.Keyspace, ep keyspace.Endpoint) string {
	return v1BlocksPrefix(ks) + url.PathEscape(ep.Model) + "/" + url.PathEscape(ep.Pod) + "/" + strconv.FormatUint(uint64(ep.Rank), 10) + "/"
}

// appendV1BlockKey appends the v1 key of hash in tier t, given the
// endpoint's v1EndpointPrefix.
func appendV1BlockKey(dst []byte, endpointPrefix string, t tier.Tier, hash uint64) []byte {
	dst = append(dst, endpointPrefix...)
	dst = append(dst, t.String()...)
	dst = append(dst, '/')
	return keyspace.AppendHash(dst, hash)
}

// parseV1BlockKey parses a v1 block key under ks.
func parseV1BlockKey(ks keyspace.Keyspace, key string) (keyspace.Block, error) {
	rest, ok := strings.CutPrefix(key, v1BlocksPrefix(ks))
	segs := strings.Split(rest, "/")
	if !ok || len(segs) != 5 {
		return keyspace.Block{}, fmt.Errorf("bench: %q is not a v1 block key", key)
	}
	model, err1 := url.PathUnescape(segs[0])
	pod, err2 := url.PathUnescape(segs[1])
	rank, err3 := strconv.ParseUint(segs[2], 10, 32)
	t, tok := tier.Parse(segs[3])
	hash, err4 := keyspace.ParseHash(segs[4])
	if err1 != nil || err2 != nil || err3 != nil || !tok || err4 != nil {
		return keyspace.Block{}, fmt.Errorf("bench: %q is not a v1 block key", key)
	}
	return keyspace.Block{Endpoint: keyspace.Endpoint{Model: model, Pod: pod, Rank: uint32(rank)}, Tier: t, Hash: hash}, nil
}

// appendV1Value appends a v1 block value: the engine hash as 16 lowercase
// hex digits in token mode, nothing in engine-hash mode.
func appendV1Value(dst []byte, mode keyspace.HashMode, engine uint64) []byte {
	if mode != keyspace.HashModeToken {
		return dst
	}
	return keyspace.AppendHash(dst, engine)
}

// placement is where a stream record was produced.
type placement struct {
	partition int32
	offset    int64
}

// v1Options shape the v1-layout writer: the ingester's window and
// transaction bounds, its hash mode, and the topic the offsets belong to.
type v1Options struct {
	ks            keyspace.Keyspace
	topic         string
	mode          keyspace.HashMode
	windowOps     int
	windowRecords int
	maxTxnOps     int
}

func (o *v1Options) defaults() {
	d := ingester.DefaultConfig()
	if o.mode == "" {
		o.mode = d.HashMode
	}
	if o.windowOps <= 0 {
		o.windowOps = d.WindowOps
	}
	if o.windowRecords <= 0 {
		o.windowRecords = d.WindowRecords
	}
	if o.maxTxnOps <= 0 {
		o.maxTxnOps = d.MaxTxnOps
	}
}

// v1Counts is what the v1 writer built.
type v1Counts struct {
	// Windows, Txns and Ops count the windows, the transactions and all
	// their operations; BlockOps the block puts and deletes among them
	// (after coalescing within a window).
	Windows, Txns, Ops, BlockOps int
	// Unkeyed counts token-mode blocks that could not be keyed (an
	// unknown parent or placeholder) and removals of unknown blocks: each
	// skipped, as the v1 ingester skipped them.
	Unkeyed int
}

// v1Endpoint is the writer's state of one endpoint.
type v1Endpoint struct {
	id     keyspace.Endpoint
	prefix string
	rec    keyspace.EndpointRecord
	lease  int64
	tiers  [tier.Count + 1]int64
	puts   [tier.Count + 1]int
	inEtcd bool
	dirty  bool
	// keys maps engine hash → token key and the tiers holding it (token
	// mode).
	keys map[uint64]v1Key
}

type v1Key struct {
	key   uint64
	tiers uint8
}

type v1OpKey struct {
	ep   *v1Endpoint
	t    tier.Tier
	hash uint64
}

type v1Op struct {
	v1OpKey
	del    bool
	engine uint64
}

// buildV1Txns turns stream s, produced at placements at (one per record),
// into the transactions a v1 ingester would commit for it, per partition:
// records in offset order make windows that end once they hold
// o.windowOps coalesced block ops or o.windowRecords records (as a v1
// ingester's windows end when it is behind: the ingest benchmark's case);
// the last op per (endpoint, tier, block) of a window wins, in the place
// of its first; the ops go out in transactions of at most o.maxTxnOps
// operations, a new endpoint's first put bringing its record and member
// key, and the window's last transaction writes the touched endpoints'
// records and the partition's next offset. Every transaction has the
// ingester's one guard (ModRevision of the partition's owner key);
// rawWrite re-points it and replaces the lease IDs (numbered from 1 here)
// with leases it grants. Leases are one per (endpoint, tier) and one per
// endpoint record, as v1 had them. The stream must hold only BlockStored
// and BlockRemoved events (what fleetsim emits): a fleet stream has no
// gaps, restarts or clears, so sequence numbers are written, not checked.
func buildV1Txns(s *Stream, at []placement, o v1Options) (*txnCapture, v1Counts, error) {
	o.defaults()
	var cnt v1Counts
	if len(at) != len(s.Records) {
		return nil, cnt, fmt.Errorf("bench: v1 writer: %d placements for %d records", len(at), len(s.Records))
	}
	byPart := map[int32][]int{}
	for i, p := range at {
		byPart[p.partition] = append(byPart[p.partition], i)
	}
	capture := newTxnCapture(o.ks)
	dec := events.NewDecoder(nil)
	var nextLease int64
	lease := func() int64 { nextLease++; return nextLease }
	for p, idx := range byPart {
		slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(at[a].offset, at[b].offset) })
		w := &v1PartitionWriter{o: o, p: p, owner: []byte(o.ks.OwnerKey(keyspace.Partition{Topic: o.topic, Partition: p})),
			offsetKey: []byte(o.ks.OffsetKey(keyspace.Partition{Topic: o.topic, Partition: p})),
			eps:       map[string]*v1Endpoint{}, idx: map[v1OpKey]int{}, lease: lease, cnt: &cnt}
		for _, i := range idx {
			if err := w.record(dec, &s.Records[i], at[i].offset); err != nil {
				return nil, cnt, err
			}
			if w.records >= o.windowRecords || len(w.ops) >= o.windowOps {
				if err := w.flush(); err != nil {
					return nil, cnt, err
				}
			}
		}
		if err := w.flush(); err != nil {
			return nil, cnt, err
		}
		capture.txns[p] = w.txns
	}
	return capture, cnt, nil
}

// v1PartitionWriter builds one partition's v1 transactions.
type v1PartitionWriter struct {
	o         v1Options
	p         int32
	owner     []byte
	offsetKey []byte
	eps       map[string]*v1Endpoint
	lease     func() int64
	cnt       *v1Counts

	// The open window: ops in order, their index by key, the endpoints
	// whose records it writes, its record count and next offset.
	ops     []v1Op
	idx     map[v1OpKey]int
	dirty   []*v1Endpoint
	records int
	next    int64

	cur  *pb.TxnRequest
	txns []*pb.TxnRequest
}

// record applies one stream record to the open window.
func (w *v1PartitionWriter) record(dec *events.Decoder, r *Record, offset int64) error {
	b, err := dec.Decode(r.Value)
	if err != nil {
		return fmt.Errorf("bench: v1 writer: record %s/%d: %w", r.Pod, r.Seq, err)
	}
	id := keyspace.Endpoint{Model: Model, Pod: r.Pod, Rank: b.Rank}
	ep := w.eps[id.String()]
	if ep == nil {
		ep = &v1Endpoint{id: id, prefix: v1EndpointPrefix(w.o.ks, id), lease: w.lease(), keys: map[uint64]v1Key{}}
		ep.rec = keyspace.EndpointRecord{HashMode: w.o.mode, Topic: w.o.topic, Partition: w.p, Lease: keyspace.LeaseID(ep.lease)}
		w.eps[id.String()] = ep
	}
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Type {
		case events.BlockStored:
			w.stored(ep, ev)
			if ev.BlockSize > 0 {
				ep.rec.BlockSize = ev.BlockSize
			}
		case events.BlockRemoved:
			w.removed(ep, ev)
		default:
			return fmt.Errorf("bench: v1 writer: record %s/%d has a %s event; fleet streams hold stores and removals only", r.Pod, r.Seq, ev.Type)
		}
	}
	seq := r.Seq
	ep.rec.Seq, ep.rec.BatchTS = &seq, b.TS
	ep.rec.LastRecord = time.Unix(0, int64(b.TS*1e9)).UTC()
	if !ep.dirty {
		ep.dirty = true
		w.dirty = append(w.dirty, ep)
	}
	w.records++
	w.next = offset + 1
	return nil
}

func (w *v1PartitionWriter) stored(ep *v1Endpoint, ev *events.Event) {
	if w.o.mode != keyspace.HashModeToken {
		for _, h := range ev.BlockHashes {
			w.add(ep, ev.Tier, h, false, h)
		}
		return
	}
	if len(ev.TokenIDs) == 0 { // a placeholder: the key its engine hash has
		for _, h := range ev.BlockHashes {
			k, ok := ep.keys[h]
			if !ok {
				w.cnt.Unkeyed++
				continue
			}
			k.tiers |= 1 << ev.Tier
			ep.keys[h] = k
			w.add(ep, ev.Tier, k.key, false, h)
		}
		return
	}
	bs := int(ev.BlockSize)
	parent := client.TokenKeyRoot
	k, known := ep.keys[ev.ParentHash]
	if bs <= 0 || len(ev.TokenIDs) != bs*len(ev.BlockHashes) || (ev.HasParent && !known) {
		w.cnt.Unkeyed += len(ev.BlockHashes)
		return
	}
	if ev.HasParent {
		parent = k.key
	}
	toks := make([]uint32, bs)
	for i, h := range ev.BlockHashes {
		for j, t := range ev.TokenIDs[i*bs : (i+1)*bs] {
			toks[j] = uint32(t)
		}
		key := client.TokenBlockKey(parent, toks, nil)
		k := ep.keys[h]
		k.key, k.tiers = key, k.tiers|1<<ev.Tier
		ep.keys[h] = k
		w.add(ep, ev.Tier, key, false, h)
		parent = key
	}
}

func (w *v1PartitionWriter) removed(ep *v1Endpoint, ev *events.Event) {
	for _, h := range ev.BlockHashes {
		key := h
		if w.o.mode == keyspace.HashModeToken {
			k, ok := ep.keys[h]
			if !ok || k.tiers&(1<<ev.Tier) == 0 {
				w.cnt.Unkeyed++
				continue
			}
			if k.tiers &^= 1 << ev.Tier; k.tiers == 0 {
				delete(ep.keys, h)
			} else {
				ep.keys[h] = k
			}
			key = k.key
		}
		w.add(ep, ev.Tier, key, true, 0)
	}
}

// add queues a put or delete: the last op per key wins, in the place of
// the key's first.
func (w *v1PartitionWriter) add(ep *v1Endpoint, t tier.Tier, hash uint64, del bool, engine uint64) {
	k := v1OpKey{ep: ep, t: t, hash: hash}
	if i, ok := w.idx[k]; ok {
		w.ops[i].del, w.ops[i].engine = del, engine
		return
	}
	w.idx[k] = len(w.ops)
	w.ops = append(w.ops, v1Op{v1OpKey: k, del: del, engine: engine})
}

// flush packs the open window into transactions and empties it.
func (w *v1PartitionWriter) flush() error {
	if w.records == 0 {
		return nil
	}
	w.cnt.Windows++
	for _, op := range w.ops {
		ep := op.ep
		need := 1
		newEp := !op.del && !ep.inEtcd
		if newEp {
			need += 2 // its record and member key first
		}
		if w.cur != nil && len(w.cur.Success)+need > w.o.maxTxnOps {
			w.emit()
		}
		if w.cur == nil {
			w.begin()
		}
		if newEp {
			if err := w.putRecord(ep); err != nil {
				return err
			}
		}
		key := appendV1BlockKey(nil, ep.prefix, op.t, op.hash)
		if op.del {
			w.cur.Success = append(w.cur.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key}}})
		} else {
			if ep.tiers[op.t] == 0 {
				ep.tiers[op.t] = w.lease()
			}
			ep.puts[op.t]++
			w.cur.Success = append(w.cur.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
				Key: key, Value: appendV1Value(nil, w.o.mode, op.engine), Lease: ep.tiers[op.t]}}})
		}
		w.cnt.BlockOps++
	}
	// The commit part: the touched endpoints' records, then the offset.
	need := 1
	for _, ep := range w.dirty {
		need++
		if !ep.inEtcd {
			need++
		}
	}
	if w.cur != nil && len(w.cur.Success)+need > w.o.maxTxnOps {
		w.emit()
	}
	if w.cur == nil {
		w.begin()
	}
	for _, ep := range w.dirty {
		if err := w.putRecord(ep); err != nil {
			return err
		}
		ep.dirty = false
	}
	w.cur.Success = append(w.cur.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: w.offsetKey, Value: []byte(keyspace.FormatOffset(w.next))}}})
	w.emit()
	clear(w.idx)
	w.ops, w.dirty, w.records = w.ops[:0], w.dirty[:0], 0
	return nil
}

// putRecord adds ep's record put (with its member key when etcd does not
// have it yet) to the open transaction.
func (w *v1PartitionWriter) putRecord(ep *v1Endpoint) error {
	ep.rec.TierLeases = map[string][]keyspace.LeaseShard{}
	for _, t := range tier.All {
		if ep.tiers[t] != 0 {
			ep.rec.TierLeases[t.String()] = []keyspace.LeaseShard{{ID: keyspace.LeaseID(ep.tiers[t]), Keys: ep.puts[t]}}
		}
	}
	v, err := ep.rec.Marshal()
	if err != nil {
		return err
	}
	if !ep.inEtcd {
		w.cur.Success = append(w.cur.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
			Key: []byte(w.o.ks.MemberKey(keyspace.Partition{Topic: w.o.topic, Partition: w.p}, ep.id)), Lease: ep.lease}}})
		ep.inEtcd = true
	}
	w.cur.Success = append(w.cur.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
		Key: []byte(w.o.ks.EndpointKey(ep.id)), Value: v, Lease: ep.lease}}})
	return nil
}

func (w *v1PartitionWriter) begin() {
	w.cur = &pb.TxnRequest{Compare: []*pb.Compare{{Result: pb.Compare_EQUAL, Target: pb.Compare_MOD, Key: w.owner,
		TargetUnion: &pb.Compare_ModRevision{}}}}
}

func (w *v1PartitionWriter) emit() {
	if w.cur == nil {
		return
	}
	w.cnt.Txns++
	w.cnt.Ops += len(w.cur.Success)
	w.txns = append(w.txns, w.cur)
	w.cur = nil
}

// listV1 lists a v1 keyspace as the v1 reader did, and returns the block
// keys it read: the endpoints' records with one Get, then the blocks/
// section at that revision as one keys-only range per endpoint
// (contiguous ranges, cut at the endpoints' prefixes), four in flight,
// every key parsed. It builds no index: what is timed is the listing,
// which is what the layout changes.
func listV1(ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) (int, error) {
	resp, err := cli.Get(ctx, ks.EndpointsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("bench: v1 list: %w", err)
	}
	rev := resp.Header.Revision
	var bounds []string
	for _, kv := range resp.Kvs {
		ep, err := ks.ParseEndpointKey(string(kv.Key))
		if err != nil {
			return 0, fmt.Errorf("bench: v1 list: %w", err)
		}
		bounds = append(bounds, v1EndpointPrefix(ks, ep))
	}
	slices.Sort(bounds)
	section := v1BlocksPrefix(ks)
	if len(bounds) > 0 {
		bounds[0] = section
	} else {
		bounds = append(bounds, section)
	}
	bounds = append(bounds, keyspace.RangeEnd(section))
	results := make(chan []*mvccpb.KeyValue, 4)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	feeder := make(chan error, 1)
	go func() {
		// The feeder owns results: it closes it once every range is in.
		defer close(results)
		for i := 0; i+1 < len(bounds); i++ {
			from, to := bounds[i], bounds[i+1]
			g.Go(func() error {
				resp, err := cli.Get(gctx, from, clientv3.WithRange(to), clientv3.WithRev(rev), clientv3.WithKeysOnly())
				if err != nil {
					return fmt.Errorf("bench: v1 list [%s, %s): %w", from, to, err)
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
	n := 0
	var bad error
	for kvs := range results {
		for _, kv := range kvs {
			if _, err := parseV1BlockKey(ks, string(kv.Key)); err != nil && bad == nil {
				bad = err
			}
			n++
		}
	}
	if err := <-feeder; err != nil {
		return 0, err
	}
	return n, bad
}

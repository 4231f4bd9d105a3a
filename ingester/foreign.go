package ingester

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/kvindex/kvindex/internal/backoff"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// clearForeign deletes, in the open window, the chunk keys etcd holds for
// the window's new endpoints that their state does not have. A new
// endpoint (no record in etcd as far as the worker knows, none dropped
// in the window before it) starts at chunk 0: chunk keys already under
// its prefix were written by no writer of this partition since the claim,
// and the claim read none (its record had no member key here, or named
// another partition; or there was no record at all). Left alone, the new
// chunk 0 would be written over one of them and the rest would stay where
// no removal or clear reaches them: ghost blocks (DESIGN "The chunk rule
// (writer)", rule 4). A new endpoint dropped in the same window (with no
// successor yet) is read too, so whether the keys go does not depend on
// where a window ends: after a crash the replay may put the store and the
// drop in one window that a run without the crash wrote as two.
//
// The reads are keys-only ranges at the newest revision, one per new
// endpoint, sent MaxTxnOps at a time in one transaction (a rollout brings
// many new endpoints at once); each endpoint is read once (probed).
func (w *worker) clearForeign(ctx context.Context) error {
	var probe []*endpoint
	for _, ep := range w.win.dirty {
		if ep.probed || ep.inEtcd || ep.base != nil || ep.pred != nil {
			continue
		}
		if ep.gone && w.eps[ep.id] != nil {
			// Dropped in the window and started again: the successor's
			// writes are the window's for these keys (and it is probed
			// when it comes to commit as new itself, or has this one as
			// its predecessor).
			continue
		}
		ep.probed = true
		probe = append(probe, ep)
	}
	for len(probe) > 0 {
		batch := probe[:min(len(probe), w.cfg.MaxTxnOps)]
		probe = probe[len(batch):]
		req := &pb.TxnRequest{Success: make([]*pb.RequestOp, len(batch))}
		for i, ep := range batch {
			req.Success[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{
				Key: []byte(ep.chunksPrefix), RangeEnd: []byte(keyspace.RangeEnd(ep.chunksPrefix)), KeysOnly: true}}}
		}
		var resp *pb.TxnResponse
		err := backoff.Retry(ctx, retryBackoff(), func(ctx context.Context) error {
			var err error
			resp, err = w.kv.Txn(ctx, req)
			return err
		}, nil)
		if err != nil {
			return fmt.Errorf("ingester: listing the chunks of %d new endpoints: %w", len(batch), err)
		}
		for i, ep := range batch {
			w.deleteForeign(ep, resp.Responses[i].GetResponseRange().GetKvs())
		}
	}
	return nil
}

// deleteForeign puts in the window a delete of each of kvs (the chunk keys
// etcd holds under ep's prefix) that ep's state lacks, and counts and logs
// what it found.
func (w *worker) deleteForeign(ep *endpoint, kvs []*mvccpb.KeyValue) {
	var found, deleted int
	for _, kv := range kvs {
		prefix, t, seq, err := w.cfg.Keyspace.SplitChunkKey(string(kv.Key))
		if err != nil || prefix != ep.chunksPrefix {
			continue // not a chunk key of this endpoint; readers skip it too
		}
		found++
		if ep.chunks[t].chunks[seq] == nil {
			w.win.chunkChanged(ep, t, seq, nil)
			deleted++
		}
	}
	if found > 0 {
		w.m.drops.WithLabelValues("foreign_chunks").Inc()
		w.log.Warn("a new endpoint had chunk keys in etcd that no claim read; deleting them with its first write (written outside the ingesters, or its record lost its member key)",
			"endpoint", ep.id.String(), "chunks", found, "deleted", deleted, "overwritten", found-deleted)
	}
}

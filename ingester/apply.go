package ingester

import (
	"context"
	"errors"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// Record header names and values (DESIGN "Kafka record contract").
const (
	headerModel       = "model"
	headerKind        = "kind"
	headerDPRank      = "dp_rank"
	headerSeq         = "seq"
	headerIncarnation = "incarnation"
	headerFormat      = "format"

	formatVLLM    = "vllm-msgpack"
	kindHeartbeat = "heartbeat"
	kindGoodbye   = "goodbye"
	kindResync    = "resync"
)

// Skip reasons of whole records: the metric labels of docs/semantics.md.
const (
	skipBadModel       = "bad_model"
	skipBadKey         = "bad_key"
	skipUnknownKind    = "unknown_kind"
	skipBadDPRank      = "bad_dp_rank"
	skipBadSeq         = "bad_seq"
	skipUnknownFmt     = "unknown_format"
	skipMalformed      = "malformed_batch"
	skipRankMismatch   = "dp_rank_mismatch"
	skipEmptyValue     = "empty_value"
	skipBadIncarnation = "bad_incarnation"
	skipDuplicate      = "duplicate"
)

// headers are the record headers the ingester reads; a repeated header's
// last value wins.
type headers struct {
	model, kind, dpRank, seq, incarnation, format   string
	hasModel, hasKind, hasDPRank, hasSeq, hasFormat bool
}

func parseHeaders(hs []kgo.RecordHeader) headers {
	var h headers
	for i := range hs {
		v := string(hs[i].Value)
		switch hs[i].Key {
		case headerModel:
			h.model, h.hasModel = v, true
		case headerKind:
			h.kind, h.hasKind = v, true
		case headerDPRank:
			h.dpRank, h.hasDPRank = v, true
		case headerSeq:
			h.seq, h.hasSeq = v, true
		case headerIncarnation:
			h.incarnation = v
		case headerFormat:
			h.format, h.hasFormat = v, true
		}
	}
	return h
}

// parseCanonical parses a canonical decimal (no sign, no leading zeros) of
// at most bits bits.
func parseCanonical(s string, bits int) (uint64, bool) {
	v, err := strconv.ParseUint(s, 10, bits)
	if err != nil || strconv.FormatUint(v, 10) != s {
		return 0, false
	}
	return v, true
}

// record applies one Kafka record (DESIGN semantics 1-8, docs/semantics.md)
// to the worker's window.
func (w *worker) record(ctx context.Context, r *kgo.Record, behind bool) error {
	w.m.records.Inc()
	// The partition clock: the record's timestamp while behind, wall time
	// once caught up, and never a time in the future (a producer's clock,
	// on a topic without LogAppendTime, must not expire every other
	// endpoint or make one immortal).
	if now := w.cfg.Clock.Now(); behind && r.Timestamp.Before(now) {
		w.advanceClock(r.Timestamp)
	} else {
		w.advanceClock(now)
	}
	if err := w.expire(ctx); err != nil {
		return err
	}
	h := parseHeaders(r.Headers)
	skip := func(reason string, args ...any) error {
		w.m.skippedRecords.WithLabelValues(reason).Inc()
		w.log.Warn("record skipped", append([]any{"reason", reason, "offset", r.Offset}, args...)...)
		return nil
	}
	if keyspace.ValidateName("model", h.model) != nil {
		return skip(skipBadModel)
	}
	pod := string(r.Key)
	if keyspace.ValidateName("pod", pod) != nil {
		return skip(skipBadKey)
	}
	if h.hasFormat && h.format != formatVLLM {
		return skip(skipUnknownFmt, "format", h.format)
	}
	if h.hasKind && h.kind != kindHeartbeat && h.kind != kindGoodbye && h.kind != kindResync {
		return skip(skipUnknownKind, "kind", h.kind)
	}
	var headerRank uint64
	if h.hasDPRank {
		var ok bool
		if headerRank, ok = parseCanonical(h.dpRank, 32); !ok {
			return skip(skipBadDPRank, "dp_rank", h.dpRank)
		}
	}
	if h.hasKind {
		id := keyspace.Endpoint{Model: h.model, Pod: pod, Rank: uint32(headerRank)}
		return w.control(ctx, id, h.kind)
	}
	var seq uint64
	if h.hasSeq {
		var ok bool
		if seq, ok = parseCanonical(h.seq, 64); !ok {
			return skip(skipBadSeq, "seq", h.seq)
		}
	}
	if h.incarnation != "" && keyspace.ValidateName("incarnation", h.incarnation) != nil {
		// It is stored in the endpoint record: bounded like a name, and
		// compared byte for byte, so it must survive JSON unchanged.
		return skip(skipBadIncarnation, "bytes", len(h.incarnation))
	}
	if len(r.Value) == 0 {
		return skip(skipEmptyValue)
	}
	batch, err := w.dec.Decode(r.Value)
	if errors.Is(err, events.ErrMalformedBatch) {
		return skip(skipMalformed, "err", err)
	}
	if h.hasDPRank && uint64(batch.Rank) != headerRank {
		return skip(skipRankMismatch, "dp_rank", h.dpRank, "batch_rank", batch.Rank)
	}
	for _, s := range batch.Skipped {
		w.m.skippedEvents.WithLabelValues(s.Reason.String()).Inc()
	}
	if n := len(batch.Skipped); n > 0 {
		// One line per record, however many events it skips: a record of
		// a million bad events must not become a million log lines.
		w.log.Warn("events skipped", "offset", r.Offset, "skipped", n, "events", len(batch.Skipped)+len(batch.Events), "first", batch.Skipped[0].Error())
	}
	id := keyspace.Endpoint{Model: h.model, Pod: pod, Rank: batch.Rank}
	ep := w.endpoint(id, true)
	w.touch(ep)
	if h.hasSeq {
		reason := ""
		cur := &ep.cur
		switch {
		case h.incarnation != "" && cur.incarnation != "" && h.incarnation != cur.incarnation:
			reason = "incarnation"
		case cur.seq == nil:
			reason = "no_seq"
		case seq == *cur.seq+1:
		case seq <= *cur.seq && batch.TS <= cur.batchTS:
			w.m.skippedRecords.WithLabelValues(skipDuplicate).Inc()
			w.log.Debug("duplicate record skipped", "offset", r.Offset, "endpoint", id.String(), "seq", seq)
			return nil
		case seq <= *cur.seq:
			reason = "restart"
		default:
			reason = "gap"
		}
		switch {
		case reason == "no_seq" && !ep.mayHaveBlocks:
			// Nothing of it is in etcd: voiding its queued ops (if any),
			// and forgetting the map entries they made, is the whole drop.
			ep.epoch++
			w.maps.clear(ep)
		case reason != "":
			w.log.Info("dropping an endpoint's blocks", "reason", reason, "endpoint", id.String(), "seq", seq, "offset", r.Offset)
			if err := w.drop(ctx, ep, reason, false); err != nil {
				return err
			}
		}
		s := seq
		cur.seq, cur.batchTS = &s, batch.TS
		if h.incarnation != "" {
			cur.incarnation = h.incarnation
		}
	}
	for i := range batch.Events {
		ev := &batch.Events[i]
		w.m.events.WithLabelValues(ev.Type.String()).Inc()
		switch ev.Type {
		case events.BlockStored:
			if w.tokenMode() {
				w.storedTokens(ep, ev)
			} else {
				for _, hash := range ev.BlockHashes {
					w.ops.add(ep, ev.Tier, hash, false)
				}
			}
			if ev.BlockSize > 0 {
				ep.cur.blockSize = ev.BlockSize
			}
		case events.BlockRemoved:
			if w.tokenMode() {
				w.removedTokens(ep, ev)
				continue
			}
			for _, hash := range ev.BlockHashes {
				w.ops.add(ep, ev.Tier, hash, true)
			}
		case events.AllBlocksCleared:
			if err := w.drop(ctx, ep, "clear", false); err != nil {
				return err
			}
		}
	}
	if w.unkeyedInRecord > 0 {
		// One line per record, as for skipped events.
		w.log.Warn("blocks not keyed", "offset", r.Offset, "endpoint", id.String(), "blocks", w.unkeyedInRecord)
		w.unkeyedInRecord = 0
	}
	if w.tokenMode() {
		return w.capMaps(ctx)
	}
	return nil
}

// control applies a kind record (DESIGN semantics 8).
func (w *worker) control(ctx context.Context, id keyspace.Endpoint, kind string) error {
	switch kind {
	case kindGoodbye:
		if ep := w.eps[id]; ep != nil {
			return w.drop(ctx, ep, "goodbye", true)
		}
	case kindResync:
		if ep := w.eps[id]; ep != nil {
			return w.drop(ctx, ep, "resync", false)
		}
	case kindHeartbeat:
		w.touch(w.endpoint(id, true))
	}
	return nil
}

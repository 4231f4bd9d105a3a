package ingester

import (
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
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
	skipRepeatedHeader = "repeated_header"
)

// headers are the record headers the ingester reads. A contract header
// given twice with different values makes the record ambiguous (which
// model, which rank?): repeated names it and the record is skipped
// (repeated_header); given twice with the same value it is read once.
type headers struct {
	model, kind, dpRank, seq, incarnation, format   string
	hasModel, hasKind, hasDPRank, hasSeq, hasFormat bool
	hasIncarnation                                  bool
	// repeated is the first contract header seen twice with different
	// values; "" when none was.
	repeated string
}

func parseHeaders(hs []kgo.RecordHeader) headers {
	var h headers
	set := func(name string, dst *string, has *bool, v string) {
		if *has && *dst != v {
			if h.repeated == "" {
				h.repeated = name
			}
			return
		}
		*dst, *has = v, true
	}
	for i := range hs {
		v := string(hs[i].Value)
		switch hs[i].Key {
		case contract.HeaderModel:
			set(contract.HeaderModel, &h.model, &h.hasModel, v)
		case contract.HeaderKind:
			set(contract.HeaderKind, &h.kind, &h.hasKind, v)
		case contract.HeaderDPRank:
			set(contract.HeaderDPRank, &h.dpRank, &h.hasDPRank, v)
		case contract.HeaderSeq:
			set(contract.HeaderSeq, &h.seq, &h.hasSeq, v)
		case contract.HeaderIncarnation:
			set(contract.HeaderIncarnation, &h.incarnation, &h.hasIncarnation, v)
		case contract.HeaderFormat:
			set(contract.HeaderFormat, &h.format, &h.hasFormat, v)
		}
	}
	return h
}

// maxLoggedValue bounds a header value quoted in a log line: headers are
// the producer's, and a 500 KB kind must not become a 500 KB log line.
// maxLoggedError bounds an error or skip detail: kvindex's own text,
// which may quote a producer's value, so longer, and still bounded.
const (
	maxLoggedValue = 64
	maxLoggedError = 256
)

// clip returns header value s for a log line: whole when short, else its
// first maxLoggedValue bytes (cut at a rune boundary) and its length.
func clip(s string) string { return clipTo(s, maxLoggedValue) }

// clipErr is clip for an error's or a skip's text, at maxLoggedError.
func clipErr(s string) string { return clipTo(s, maxLoggedError) }

func clipTo(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	n := limit
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// skipSummary is the events-skipped log line's reasons: every reason in
// the record with its count, in the order first seen ("unknown_medium=3
// invalid_event=1").
func skipSummary(skipped []events.Skip) string {
	var order []events.SkipReason
	counts := map[events.SkipReason]int{}
	for _, s := range skipped {
		if counts[s.Reason] == 0 {
			order = append(order, s.Reason)
		}
		counts[s.Reason]++
	}
	var b strings.Builder
	for i, r := range order {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(r.String())
		b.WriteByte('=')
		b.WriteString(strconv.Itoa(counts[r]))
	}
	return b.String()
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

// applier is the first of the write path's three parts: it applies a
// partition's records, in order, to the endpoints' chunk state and the
// open window (DESIGN semantics 1-8, docs/semantics.md), turning events
// into chunk changes, drops and endpoint-record changes. It does no I/O: everything it decides is
// written later by commit, and every input to a decision is the
// endpoints' state (as of the stored offset plus the records applied
// since) and the record itself. One function per record kind and event
// type; the endpoint state they change is endpoint's.
type applier struct {
	cfg *Config
	p   keyspace.Partition
	log *slog.Logger
	m   *metrics
	dec *events.Decoder
	// batch is the record being applied, decoded by dec.DecodeInto into
	// memory reused record after record: nothing keeps a slice of it past
	// record.
	batch events.Batch
	// mediums is the fingerprint of cfg.Mediums (DESIGN v1.1): every
	// endpoint record carries the one it was written under.
	mediums string
	// rule is the chunk rule's size and merge threshold.
	rule chunkRule

	// eps are the partition's endpoints; win the open window.
	eps map[keyspace.Endpoint]*endpoint
	win *window

	// clock is the partition clock; minLast a lower bound of the live
	// endpoints' last-record times (so most records skip the expiry scan).
	// The clock starts at zero when a worker starts, not at the loaded
	// endpoints' last-record times: a replay of older records (an offset
	// rewound by an operator) must age by its own record times, so the
	// endpoints it touches cannot look fresher than they were.
	clock   time.Time
	minLast time.Time

	// out is the ingester's outage watch, shared by its partitions (nil:
	// no outage rule); live is this partition's outage state (outage.go).
	out  *outageWatch
	live liveness
	// maps counts the entries of the endpoints' token-mode maps; tokBuf
	// and extraBuf are keying's buffers, unkeyedInRecord the blocks of the
	// current record token mode could not key (keying.go).
	maps            engineMaps
	tokBuf          []uint32
	extraBuf        []client.Extra
	unkeyedInRecord int
}

// record applies one Kafka record to the window. behind reports that the
// partition has records after it (the record's timestamp drives the
// partition clock then).
func (a *applier) record(r *kgo.Record, behind bool) {
	a.m.records.Inc()
	if a.out != nil {
		a.out.saw(r.Timestamp) // evidence for the topic-wide outage rule
	}
	a.recordClock(r.Timestamp, behind)
	h := parseHeaders(r.Headers)
	skip := func(reason string, args ...any) {
		a.m.skippedRecords.WithLabelValues(reason).Inc()
		a.log.Warn("record skipped", append([]any{"reason", reason, "offset", r.Offset}, args...)...)
	}
	if h.repeated != "" {
		a.m.repeatedHeader.WithLabelValues(h.repeated).Inc()
		skip(skipRepeatedHeader, "header", h.repeated)
		return
	}
	if keyspace.ValidateName("model", h.model) != nil {
		skip(skipBadModel)
		return
	}
	pod := string(r.Key)
	if keyspace.ValidateName("pod", pod) != nil {
		skip(skipBadKey)
		return
	}
	if h.hasFormat && h.format != contract.FormatVLLM {
		skip(skipUnknownFmt, "format", clip(h.format))
		return
	}
	if h.hasKind && h.kind != contract.KindHeartbeat && h.kind != contract.KindGoodbye && h.kind != contract.KindResync {
		skip(skipUnknownKind, "kind", clip(h.kind))
		return
	}
	var headerRank uint64
	if h.hasDPRank {
		var ok bool
		if headerRank, ok = parseCanonical(h.dpRank, 32); !ok {
			skip(skipBadDPRank, "dp_rank", clip(h.dpRank))
			return
		}
	}
	if h.hasKind {
		id := keyspace.Endpoint{Model: h.model, Pod: pod, Rank: uint32(headerRank)}
		switch h.kind {
		case contract.KindGoodbye:
			a.goodbye(id)
		case contract.KindResync:
			a.resync(id)
		case contract.KindHeartbeat:
			a.heartbeat(id)
		}
		return
	}
	var seq uint64
	if h.hasSeq {
		var ok bool
		if seq, ok = parseCanonical(h.seq, 64); !ok {
			skip(skipBadSeq, "seq", clip(h.seq))
			return
		}
	}
	if h.incarnation != "" && keyspace.ValidateName("incarnation", h.incarnation) != nil {
		// It is stored in the endpoint record: bounded like a name, and
		// compared byte for byte, so it must survive JSON unchanged.
		skip(skipBadIncarnation, "bytes", len(h.incarnation))
		return
	}
	if len(r.Value) == 0 {
		skip(skipEmptyValue)
		return
	}
	batch := &a.batch
	err := a.dec.DecodeInto(batch, r.Value)
	if errors.Is(err, events.ErrMalformedBatch) {
		skip(skipMalformed, "err", clipErr(err.Error()))
		return
	}
	if h.hasDPRank && uint64(batch.Rank) != headerRank {
		skip(skipRankMismatch, "dp_rank", clip(h.dpRank), "batch_rank", batch.Rank)
		return
	}
	for _, s := range batch.Skipped {
		a.m.skippedEvents.WithLabelValues(s.Reason.String()).Inc()
	}
	if n := len(batch.Skipped); n > 0 {
		// One line per record, however many events it skips: a record of
		// a million bad events must not become a million log lines.
		a.log.Warn("events skipped", "offset", r.Offset, "skipped", n, "events", len(batch.Skipped)+len(batch.Events),
			"reasons", skipSummary(batch.Skipped), "first", clipErr(batch.Skipped[0].Error()))
	}
	id := keyspace.Endpoint{Model: h.model, Pod: pod, Rank: batch.Rank}
	ep := a.endpoint(id, true)
	a.remapped(ep)
	a.touch(ep)
	if h.hasSeq && !a.sequence(ep, seq, batch.TS, h.incarnation, r.Offset) {
		return
	}
	a.chooseGroup(ep, batch.Events)
	a.beginRecord(ep, batch.Events)
	otherGroup := 0
	// Counted per record, not per event: the counters are shared by the
	// partitions' workers, and one atomic add per event was 3% of a
	// backlog's ingest CPU.
	var byType [len(a.m.eventsByType)]int
	for i := range batch.Events {
		ev := &batch.Events[i]
		if !inGroup(ep, ev) {
			otherGroup++
			continue
		}
		if int(ev.Type) < len(byType) {
			byType[ev.Type]++
		} else {
			a.m.eventsOf(ev.Type).Inc()
		}
		switch ev.Type {
		case events.BlockStored:
			a.stored(ep, ev)
		case events.BlockRemoved:
			a.removed(ep, ev)
		case events.AllBlocksCleared:
			a.cleared(ep)
		case events.TierBlocksCleared:
			a.tierCleared(ep, ev.Tier)
		}
	}
	for t := range ep.chunks {
		ep.chunks[t].endRecord()
	}
	for t, n := range byType {
		if n > 0 {
			a.m.eventsOf(events.Type(t)).Add(float64(n))
		}
	}
	if otherGroup > 0 {
		// Expected of every hybrid model, so counted and logged at debug
		// level only, once per record.
		a.m.skippedEvents.WithLabelValues(events.SkipOtherGroup.String()).Add(float64(otherGroup))
		a.log.Debug("events of other KV-cache groups skipped", "offset", r.Offset, "endpoint", id.String(), "group", ep.cur.group, "skipped", otherGroup)
	}
	if a.unkeyedInRecord > 0 {
		// One line per record, as for skipped events.
		a.log.Warn("blocks not keyed", "offset", r.Offset, "endpoint", id.String(), "blocks", a.unkeyedInRecord)
		a.unkeyedInRecord = 0
	}
	if a.tokenMode() {
		a.capMaps()
	}
}

// sequence checks a batch's sequence number against ep's state (DESIGN
// semantics 7): the next one applies; a duplicate (seq and batch time not
// past the last applied) is skipped, and sequence reports false; a gap, a
// restart, a new incarnation or an endpoint with no sequence yet drops
// ep's blocks before the batch applies.
func (a *applier) sequence(ep *endpoint, seq uint64, batchTS float64, incarnation string, offset int64) bool {
	reason := ""
	cur := &ep.cur
	switch {
	case incarnation != "" && cur.incarnation != "" && incarnation != cur.incarnation:
		reason = "incarnation"
	case cur.seq == nil:
		reason = "no_seq"
	case seq == *cur.seq+1:
	case seq <= *cur.seq && batchTS <= cur.batchTS:
		a.m.skippedRecords.WithLabelValues(skipDuplicate).Inc()
		a.log.Debug("duplicate record skipped", "offset", offset, "endpoint", ep.id.String(), "seq", seq)
		return false
	case seq <= *cur.seq:
		reason = "restart"
	default:
		reason = "gap"
	}
	switch {
	case reason == "no_seq" && !ep.hasChunks():
		// It has no blocks: forgetting the map entries is the whole drop.
		a.maps.clear(ep)
	case reason != "":
		a.log.Info("dropping an endpoint's blocks", "reason", reason, "endpoint", ep.id.String(), "seq", seq, "offset", offset)
		a.drop(ep, reason, false)
	}
	if reason == "incarnation" || reason == "restart" {
		// A new engine process learns its KV-cache groups afresh.
		cur.group, cur.groupSet = 0, false
	}
	s := seq
	cur.seq, cur.batchTS = &s, batchTS
	if incarnation != "" {
		cur.incarnation = incarnation
	}
	return true
}

// beginRecord opens rule 1's threshold for a record's events on ep: per
// tier, the record's first new block is appended by chunkRule.opens, given
// the blocks the record's events of ep's group store in that tier. Why
// (BENCHMARKS.md "The open threshold of a record"): a put carries a
// chunk's whole value, so a record appended to a filling open chunk
// rewrites the chunk for the blocks it brings, window after window;
// started on a fresh chunk it writes only what it brought. The threshold
// depends on the records alone, never on where a window ends, so a replay
// rebuilds the same chunks.
func (a *applier) beginRecord(ep *endpoint, evs []events.Event) {
	var stores [tier.Count + 1]int
	for i := range evs {
		if ev := &evs[i]; ev.Type == events.BlockStored && inGroup(ep, ev) {
			stores[ev.Tier] += len(ev.BlockHashes)
		}
	}
	for t := range ep.chunks {
		ep.chunks[t].beginRecord(stores[t])
	}
}

// stored applies a BlockStored event: a store of each block hash by the
// chunk rule (chunks.go), and the endpoint's block size. In token mode the
// size is taken only from an event whose token ids keyed a block at it:
// a store skipped as unkeyable (its tokens do not fill its blocks) names
// no size the endpoint's keys were made at, and token Lookups key the
// prompt at each endpoint's size.
func (a *applier) stored(ep *endpoint, ev *events.Event) {
	a.win.blockOps += len(ev.BlockHashes)
	sized := ev.BlockSize > 0
	if a.tokenMode() {
		sized = a.storedTokens(ep, ev) && sized
	} else {
		for _, hash := range ev.BlockHashes {
			storeChunk(a.rule, ep, ev.Tier, hash, hash, a.win)
		}
	}
	if sized {
		ep.cur.blockSize = ev.BlockSize
	}
}

// removed applies a BlockRemoved event: a removal of each block hash.
func (a *applier) removed(ep *endpoint, ev *events.Event) {
	a.win.blockOps += len(ev.BlockHashes)
	if a.tokenMode() {
		a.removedTokens(ep, ev)
		return
	}
	for _, hash := range ev.BlockHashes {
		removeChunk(a.rule, ep, ev.Tier, hash, a.win)
	}
}

// cleared applies an AllBlocksCleared event: a drop of every block of the
// endpoint, which keeps its record.
func (a *applier) cleared(ep *endpoint) { a.drop(ep, "clear", false) }

// goodbye applies a goodbye record (DESIGN semantics 8): the endpoint's
// blocks and record go.
func (a *applier) goodbye(id keyspace.Endpoint) {
	if ep := a.eps[id]; ep != nil {
		a.drop(ep, "goodbye", true)
	}
}

// resync applies a resync record: the endpoint's blocks go, its record
// stays (the engine sends its state again).
func (a *applier) resync(id keyspace.Endpoint) {
	if ep := a.eps[id]; ep != nil {
		a.remapped(ep)
		a.drop(ep, "resync", false)
	}
}

// heartbeat applies a heartbeat record: the endpoint is alive (created if
// new).
func (a *applier) heartbeat(id keyspace.Endpoint) {
	ep := a.endpoint(id, true)
	a.remapped(ep)
	a.touch(ep)
}

// touch records a batch or heartbeat of ep at the partition clock.
func (a *applier) touch(ep *endpoint) {
	ep.cur.lastRecord = a.clock
	ep.outageCredit = a.live.credit
	if a.clock.Before(a.minLast) {
		a.minLast = a.clock
	}
	a.win.markDirty(ep)
}

// endpoint returns the state of id, creating it (absent from etcd) when
// create is set; nil otherwise.
func (a *applier) endpoint(id keyspace.Endpoint, create bool) *endpoint {
	if ep := a.eps[id]; ep != nil || !create {
		return ep
	}
	ep := newEndpoint(a.cfg.Keyspace, a.p, id)
	ep.hashMode = a.cfg.HashMode
	ep.cur.mediums = a.mediums
	for _, d := range a.win.drops {
		// A predecessor of the same identity dropped with its record in
		// this window: its record may still be etcd's.
		if d.ep.id == id && d.ep.gone {
			if ep.pred = d.ep; !d.ep.inEtcd {
				ep.pred = d.ep.pred
			}
		}
	}
	a.eps[id] = ep
	return ep
}

// drop decides a drop of ep's blocks: every chunk of every tier is
// deleted in the window (chunk rule 4), and the lease manager settles the
// leases they emptied. With deleteRecord (goodbye, expiry) the record goes
// too and the endpoint is forgotten: a later record of it starts a new
// state, chunk_next 0 included.
func (a *applier) drop(ep *endpoint, reason string, deleteRecord bool) {
	a.m.drops.WithLabelValues(reason).Inc()
	a.maps.clear(ep) // every entry names a block this drop deletes
	for _, t := range tier.All {
		dropChunks(ep, t, a.win)
	}
	a.win.drop(ep, deleteRecord)
	if deleteRecord {
		ep.gone = true
		if a.eps[ep.id] == ep {
			delete(a.eps, ep.id)
		}
	}
}

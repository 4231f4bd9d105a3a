package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/events"
)

// inKind is the kind of an inEvent.
type inKind uint8

const (
	evConnected inKind = iota + 1
	evMessage
	evDisconnected
)

// inEvent is what the SUB reader hands the sequencer, in order: a
// connection, its messages, its end.
type inEvent struct {
	kind    inKind
	seq     uint64
	payload []byte
	err     error
}

// replayResult is how one replay request ended.
type replayResult uint8

const (
	replayDone       replayResult = iota + 1 // read to the end marker, contiguous
	replayRestart                            // the engine is a new process
	replayIncomplete                         // error, timeout or a hole: ask again
)

// errReplayHole is a replay answer that skipped sequence numbers after
// covering some (a ROUTER past its high-water mark drops messages).
var errReplayHole = errors.New("replay answer skipped sequence numbers")

// sequencer turns the engine's live and replayed batches into records in
// sequence order. It runs on Run's goroutine only.
//
// The cursor: next is the sequence number the stream continues with (when
// known); last and lastPayload are the newest batch produced, which every
// replay request re-reads to verify the engine is still the same process
// (a new process has different bytes at that seq, or none at all).
type sequencer struct {
	b   *Bridge
	st  *stream
	out chan<- *kgo.Record

	known bool
	next  uint64
	// from01 is set while the cursor is 0 because the engine's replay
	// buffer was empty at a fresh start: the stream may start at 0 (vLLM)
	// or at 1 (llm-d-inference-sim), so a first batch at 1 continues it.
	from01      bool
	hasLast     bool
	last        uint64
	lastPayload []byte
	// dupFrom bounds the replay/live overlap: a live batch in [dupFrom,
	// next) is one a replay produced since the last live batch (the
	// subscription is live before the replay is asked, so the queue holds
	// batches the answer also had), a true duplicate. A live batch below
	// dupFrom was not produced from a replay after the connection's last
	// batch: see onLive.
	dupFrom uint64
	// liveSeen and liveLast are the last seq the current connection
	// delivered live: a PUB socket sends each batch once, in order, so on
	// one connection a seq at or below it is never a duplicate but a
	// stream that went back (see wentBack).
	liveSeen bool
	liveLast uint64

	connected bool
	// ignoreLive drops live messages until the next connection: set when a
	// replay showed that the engine behind the current connection has been
	// replaced, so its queued messages are stale.
	ignoreLive bool
	// restarts counts new engine processes detected.
	restarts int
	// rankChecked is set once the first batch after a connection has been
	// checked against the configured rank (checkRank).
	rankChecked bool
	// idle, when set (bind mode), is called once the stream has been
	// disconnected for Config.PodIdleTimeout; true ends run (the stream
	// was removed).
	idle      func() bool
	idleTimer clockwork.Timer
	// replayBackoff is the current wait after failed heals (0: replay is
	// trusted), and replayDownUntil the time until which live gaps are
	// resynced without asking the replay socket (Config.ReplayBackoff).
	replayBackoff   time.Duration
	replayDownUntil time.Time
}

// replayBackingOff reports whether live gaps skip the replay socket now.
func (s *sequencer) replayBackingOff() bool {
	return s.replayBackoff > 0 && s.b.clock.Now().Before(s.replayDownUntil)
}

// healed records how a heal ended: a failure starts (or doubles) the
// replay backoff, a success ends it.
func (s *sequencer) healed(err error) {
	cfg := &s.b.cfg
	if err == nil {
		if s.replayBackoff > 0 {
			s.st.log.Info("replay answered again: live gaps are healed again")
		}
		s.replayBackoff, s.replayDownUntil = 0, time.Time{}
		return
	}
	if s.replayBackoff == 0 {
		s.replayBackoff = cfg.ReplayBackoff
	} else {
		s.replayBackoff = min(2*s.replayBackoff, cfg.MaxReplayBackoff)
	}
	s.replayDownUntil = s.b.clock.Now().Add(s.replayBackoff)
	s.st.log.Warn("replay socket failing: live gaps are resynced without asking it for a while", "backoff", s.replayBackoff, "err", err)
}

// continues reports whether a batch at seq continues the cursor.
func (s *sequencer) continues(seq uint64) bool {
	return !s.known || seq == s.next || (s.from01 && s.next == 0 && seq == 1)
}

// idleChan is the idle timer's channel, nil (never ready) without one.
func (s *sequencer) idleChan() <-chan time.Time {
	if s.idleTimer == nil {
		return nil
	}
	return s.idleTimer.Chan()
}

// run is the sequencer loop: engine events in order, and heartbeats while
// the PUB socket is connected, until ctx ends or the reader stops.
func (s *sequencer) run(ctx context.Context, in <-chan inEvent) {
	tick := s.b.clock.NewTicker(s.b.cfg.HeartbeatInterval)
	defer tick.Stop()
	defer s.stopIdle()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-in:
			if !ok {
				return
			}
			if err := s.handle(ctx, ev); err != nil {
				return // only ctx ends handling early
			}
		case <-tick.Chan():
			if s.connected {
				if s.emit(ctx, s.st.controlRecord(contract.KindHeartbeat)) != nil {
					return
				}
			}
		case <-s.idleChan():
			s.idleTimer = nil
			if s.idle() {
				return
			}
		}
	}
}

// float forgets the cursor: the next batch starts the stream wherever it
// is (fresh start, or after a resync).
func (s *sequencer) float() { s.known, s.from01, s.hasLast, s.lastPayload = false, false, false, nil }

func (s *sequencer) stopIdle() {
	if s.idleTimer != nil {
		s.idleTimer.Stop()
		s.idleTimer = nil
	}
}

func (s *sequencer) handle(ctx context.Context, ev inEvent) error {
	b := s.b
	switch ev.kind {
	case evConnected:
		if !s.connected {
			b.m.connected.Inc()
		}
		s.connected, s.ignoreLive, s.rankChecked, s.liveSeen = true, false, false, false
		s.stopIdle()
		s.st.state(true, false)
		b.m.connects.Inc()
		if err := s.onConnect(ctx); err != nil {
			return err
		}
		s.st.state(true, true)
	case evDisconnected:
		if s.connected {
			b.m.connected.Dec()
		}
		s.connected, s.liveSeen = false, false
		s.st.state(false, false)
		if s.idle != nil && s.idleTimer == nil {
			s.idleTimer = b.clock.NewTimer(b.cfg.PodIdleTimeout)
		}
	case evMessage:
		return s.onLive(ctx, ev.seq, ev.payload)
	}
	return nil
}

// onConnect catches up after a (re)connection: everything the engine
// buffered from the cursor on (from 0 on a fresh start), since PUB drops
// whatever was published while no subscription was live.
func (s *sequencer) onConnect(ctx context.Context) error {
	log := s.st.log
	resume := s.known || s.hasLast
	if s.st.replayAddr == "" {
		if resume {
			log.Warn("reconnected without a replay socket: batches may be lost, producing resync")
			s.float()
			return s.resync(ctx, reasonReconnectNoReplay)
		}
		return nil
	}
	err := s.heal(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.healed(err)
	if err == nil {
		return nil
	}
	if !resume {
		// Nothing produced yet: the first live batch starts the stream;
		// the ingester's sequence rules judge it against what an earlier
		// bridge produced.
		log.Warn("initial replay failed, starting from the live stream", "err", err)
		return nil
	}
	log.Warn("replay after reconnecting failed, producing resync", "err", err)
	s.float()
	return s.resync(ctx, reasonReplayFailed)
}

func (s *sequencer) onLive(ctx context.Context, seq uint64, payload []byte) error {
	b := s.b
	b.m.received.WithLabelValues(sourceLive).Inc()
	if s.ignoreLive {
		b.m.skipped.WithLabelValues(skipStale).Inc()
		return nil
	}
	switch {
	case s.wentBackLive(seq):
		return s.wentBack(ctx, seq, payload, "at or below the connection's previous seq")
	case s.continues(seq):
		return s.produce(ctx, seq, payload, false)
	case s.inOverlap(seq):
		b.m.duplicates.WithLabelValues(sourceLive).Inc() // the replay/live overlap
		return nil
	case seq < s.next:
		return s.belowCursor(ctx, seq, payload)
	}
	b.m.gaps.Inc()
	s.st.log.Info("sequence gap", "expected_seq", s.next, "seq", seq)
	reason := reasonNoReplay
	switch {
	case s.st.replayAddr == "":
	case s.replayBackingOff():
		reason = reasonReplayBackoff
	default:
		reason = reasonUnhealedGap
		restarts := s.restarts
		err := s.heal(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.restarts != restarts {
			// The engine restarted under this connection: what it still
			// delivers is the old process's. Reconnect to the new one.
			s.ignoreLive = true
			s.st.drop()
			b.m.skipped.WithLabelValues(skipStale).Inc()
			return nil
		}
		if err != nil {
			s.st.log.Warn("healing gap failed", "expected_seq", s.next, "seq", seq, "err", err)
		}
		s.healed(err)
	}
	if s.known && s.next < seq && !s.continues(seq) {
		s.st.log.Warn("unhealed gap, producing resync", "missing_from", s.next, "missing_to", seq-1, "reason", reason)
		if err := s.resync(ctx, reason); err != nil {
			return err
		}
		s.next = seq
	}
	if s.continues(seq) {
		return s.produce(ctx, seq, payload, false)
	}
	// The replay covered it, or reported it gone (an overrun, resynced).
	b.m.duplicates.WithLabelValues(sourceLive).Inc()
	return nil
}

// wentBackLive records seq as the current connection's last live batch
// and reports whether it is at or below the one before it on the same
// connection: a PUB socket sends each batch once, in order, so that is a
// stream that went back, never a duplicate.
func (s *sequencer) wentBackLive(seq uint64) bool {
	back := s.liveSeen && seq <= s.liveLast
	s.liveSeen, s.liveLast = true, seq
	return back
}

// inOverlap reports whether a live batch at seq is below the cursor in
// the replay/live overlap (dupFrom): a batch a replay produced since the
// connection's last live batch, a true duplicate.
func (s *sequencer) inOverlap(seq uint64) bool { return seq < s.next && seq >= s.dupFrom }

// belowCursor handles a live batch below the cursor that no replay
// produced since the connection's last batch: the first batch of a
// connection below what was produced before it, or one below where a
// replay answer moved the cursor (replayOnce's overrun). It is a
// duplicate only when the engine still holds the last batch produced
// with the same bytes (the cursor is the engine's: a bind-mode pod taken
// over by a new connection redelivers what the old one had delivered, a
// live queue older than the overrun drains); else the cursor is not the
// engine's (a far-future seq from a replay answer, a new process) and
// the stream went back. Without a replay socket to ask, it went back.
// One replay request at most per such batch: once the cursor is
// confirmed, the batches after it on the connection fall in the overlap.
func (s *sequencer) belowCursor(ctx context.Context, seq uint64, payload []byte) error {
	if s.st.replayAddr == "" || !s.hasLast || s.replayBackingOff() {
		return s.wentBack(ctx, seq, payload, "below the cursor, which cannot be checked")
	}
	held, err := s.cursorHeld(ctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		s.st.log.Warn("checking the cursor against the replay socket failed", "last_seq", s.last, "err", err)
		return s.wentBack(ctx, seq, payload, "below the cursor, which the replay socket could not confirm")
	}
	if !held {
		return s.wentBack(ctx, seq, payload, "below the cursor, which the engine does not hold")
	}
	s.b.m.duplicates.WithLabelValues(sourceLive).Inc()
	s.dupFrom = seq
	return nil
}

// cursorHeld asks the replay socket for the last batch produced and
// reports whether the engine holds it with the same bytes.
func (s *sequencer) cursorHeld(ctx context.Context) (bool, error) {
	b := s.b
	outcome := replayOutcomeError
	defer func() { b.m.replays.WithLabelValues(outcome).Inc() }()
	rs, err := b.openReplay(ctx, s.st, s.last)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errReplay, err)
	}
	defer rs.close()
	seq, payload, end, err := rs.next()
	if err != nil {
		return false, fmt.Errorf("%w: from seq %d: %v", errReplay, s.last, err)
	}
	b.m.received.WithLabelValues(sourceReplay).Inc()
	if !end && seq == s.last && bytes.Equal(payload, s.lastPayload) {
		outcome = replayOutcomeComplete
		return true, nil
	}
	outcome = replayOutcomeRestart
	return false, nil
}

// wentBack handles a live batch at seq that the stream went back to: no
// duplicate of anything produced, but a stream that started again below
// the cursor without the connection dropping (a new engine process behind
// a ZMQ proxy, a publisher whose counter was reset) or a cursor that an
// earlier bogus far-future seq (live or in a replay answer) moved. Either
// way what the ingester has for the endpoint may not be this stream's:
// as for an engine restart nothing can verify, the bridge produces a
// resync (reason seq_backwards) and starts the stream again at seq. A
// bogus jump so costs one resync instead of every later batch.
func (s *sequencer) wentBack(ctx context.Context, seq uint64, payload []byte, why string) error {
	s.st.log.Warn("sequence went back on the live stream (engine restarted behind the connection, counter reset, or an earlier bogus seq): producing resync and starting again there",
		"seq", seq, "expected_seq", s.next, "why", why)
	s.float()
	if err := s.resync(ctx, reasonSeqBackwards); err != nil {
		return err
	}
	return s.produce(ctx, seq, payload, false)
}

// heal asks the replay socket for what follows the cursor and produces it,
// asking again while answers make progress (a ROUTER drops messages past
// its high-water mark), up to ReplayAttempts answers in a row without
// progress.
func (s *sequencer) heal(ctx context.Context) error {
	b := s.b
	stalled, restarts := 0, 0
	backoff := b.cfg.ReconnectBackoff
	for {
		res, progressed, err := s.replayOnce(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch res {
		case replayDone:
			return nil
		case replayRestart:
			restarts++
			if restarts > 1 {
				return fmt.Errorf("%w: the engine looked restarted twice in one catch-up", errReplay)
			}
			s.restarts++
			b.m.engineRestarts.Inc()
			s.st.log.Info("engine restarted: new process, producing its batches from its first buffered seq", "last_seq", s.last)
			s.float()
			continue
		}
		if progressed {
			stalled, backoff = 0, b.cfg.ReconnectBackoff
			continue
		}
		if stalled++; stalled >= b.cfg.ReplayAttempts {
			return fmt.Errorf("%w: %d attempts without progress: %v", errReplay, stalled, err)
		}
		s.st.log.Debug("replay attempt made no progress", "attempt", stalled, "err", err)
		if !b.sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, b.cfg.MaxReconnectBackoff)
	}
}

// replayOnce sends one replay request and produces what continues the
// cursor. With a last batch it asks from that batch's seq, to verify the
// engine process; else from the cursor, or from 0 on a fresh start.
func (s *sequencer) replayOnce(ctx context.Context) (res replayResult, progressed bool, err error) {
	b := s.b
	var from uint64
	verify := s.hasLast
	switch {
	case s.hasLast:
		from = s.last
	case s.known:
		from = s.next
	}
	outcome := replayOutcomeError
	defer func() { b.m.replays.WithLabelValues(outcome).Inc() }()
	rs, err := b.openReplay(ctx, s.st, from)
	if err != nil {
		return replayIncomplete, false, fmt.Errorf("%w: %v", errReplay, err)
	}
	defer rs.close()
	first := true
	// An answer that brings nothing new for as long as one message may
	// take is stalled (an engine resending old batches without end), and
	// fails like a silent one: the sequencer must not wait on it forever.
	lastNew := time.Now()
	for {
		if time.Since(lastNew) > b.cfg.ReplayTimeout {
			return replayIncomplete, progressed, fmt.Errorf("%w: from seq %d: no new batch for %v (only batches already produced)", errReplay, from, b.cfg.ReplayTimeout)
		}
		seq, payload, end, err := rs.next()
		if err != nil {
			return replayIncomplete, progressed, fmt.Errorf("%w: from seq %d: %v", errReplay, from, err)
		}
		if end {
			switch {
			case verify && first:
				// Nothing at or after our last batch: a new process that
				// has published less than we had seen.
				outcome = replayOutcomeRestart
				return replayRestart, progressed, nil
			case !s.known && first:
				// An empty buffer: the engine has published nothing yet,
				// so its stream starts at 0, or at 1 for engines that
				// number from 1 (llm-d-inference-sim).
				s.known, s.next, s.from01, s.dupFrom = true, 0, true, 0
			}
			outcome = replayOutcomeComplete
			return replayDone, progressed, nil
		}
		if seq < from {
			return replayIncomplete, progressed, fmt.Errorf("%w: asked from seq %d, got %d", errReplay, from, seq)
		}
		b.m.received.WithLabelValues(sourceReplay).Inc()
		wasFirst := first
		first = false
		if wasFirst && verify {
			if seq == s.last {
				if bytes.Equal(payload, s.lastPayload) {
					continue // same process
				}
				outcome = replayOutcomeRestart
				return replayRestart, progressed, nil
			}
			// The engine no longer holds our last batch: what followed it
			// is gone (or this is a new process past its buffer): either
			// way, what is missing cannot be replayed.
			if err := s.overrun(ctx, s.last+1, seq); err != nil {
				return replayIncomplete, progressed, err
			}
		} else if wasFirst && s.known && seq > s.next && !s.continues(seq) {
			if err := s.overrun(ctx, s.next, seq); err != nil {
				return replayIncomplete, progressed, err
			}
		}
		switch {
		case s.continues(seq):
			if err := s.produce(ctx, seq, payload, true); err != nil {
				return replayIncomplete, progressed, err
			}
			progressed = true
			lastNew = time.Now()
		case seq < s.next:
			b.m.duplicates.WithLabelValues(sourceReplay).Inc()
		default:
			outcome = replayOutcomeHole
			return replayIncomplete, progressed, fmt.Errorf("%w: expected seq %d, got %d", errReplayHole, s.next, seq)
		}
	}
}

// overrun produces a resync for batches [from, to) the engine no longer
// buffers, and moves the cursor to to.
func (s *sequencer) overrun(ctx context.Context, from, to uint64) error {
	s.st.log.Warn("replay buffer overrun, producing resync", "missing_from", from, "missing_to", to-1)
	if err := s.resync(ctx, reasonReplayOverrun); err != nil {
		return err
	}
	s.known, s.next, s.from01, s.hasLast, s.lastPayload = true, to, false, false, nil
	s.dupFrom = to
	return nil
}

// produce hands one batch to the producer and advances the cursor past it.
// A batch over MaxRecordBytes is skipped, counted and replaced by a
// resync.
func (s *sequencer) produce(ctx context.Context, seq uint64, payload []byte, replayed bool) error {
	b := s.b
	// A live batch ends the replay run the overlap may repeat; a replayed
	// one starts it if the stream starts here.
	if !replayed {
		s.dupFrom = seq + 1
	} else if !s.known {
		s.dupFrom = seq
	}
	if len(payload) > b.cfg.MaxRecordBytes {
		b.m.skipped.WithLabelValues(skipRecordTooLarge).Inc()
		s.st.log.Warn("batch over the record size limit skipped, producing resync", "seq", seq, "bytes", len(payload), "limit", b.cfg.MaxRecordBytes)
		if err := s.resync(ctx, reasonRecordTooLarge); err != nil {
			return err
		}
		s.known, s.next, s.from01 = true, seq+1, false
		return nil
	}
	if !s.rankChecked {
		s.rankChecked = true
		s.checkRank(seq, payload)
	}
	if err := s.emit(ctx, s.st.batchRecord(seq, payload)); err != nil {
		return err
	}
	if replayed {
		b.m.replayed.Inc()
	}
	s.known, s.next, s.from01 = true, seq+1, false
	s.hasLast, s.last, s.lastPayload = true, seq, payload
	return nil
}

// checkRank decodes one batch (the first after each connection) and logs
// an error when its data_parallel_rank disagrees with Config.DPRank: the
// ingester skips every such record (dp_rank_mismatch), so the endpoint
// would stay empty. The batch is produced either way; the bridge never
// changes or judges payloads.
func (s *sequencer) checkRank(seq uint64, payload []byte) {
	batch, err := events.NewDecoder(nil).Decode(payload)
	if err != nil || !batch.HasRank || batch.Rank == s.st.dpRank {
		return
	}
	s.b.m.rankMismatches.Inc()
	s.st.log.Error("batch data_parallel_rank differs from the endpoint's dp_rank: the ingester will skip this endpoint's batches",
		"seq", seq, "batch_rank", batch.Rank, "dp_rank", s.st.dpRank)
}

func (s *sequencer) resync(ctx context.Context, reason string) error {
	s.b.m.resyncs.WithLabelValues(reason).Inc()
	return s.emit(ctx, s.st.controlRecord(contract.KindResync))
}

// emit hands a record to the producer goroutine, waiting while the bounded
// channel is full (backpressure from Kafka) until ctx ends.
func (s *sequencer) emit(ctx context.Context, r *kgo.Record) error {
	select {
	case s.out <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain runs at shutdown on what the SUB reader had already received:
// batches that continue the cursor are produced; the first gap stops it
// (no replay at shutdown: a restarted bridge replays it). in is closed by
// the reader, which has stopped.
func (s *sequencer) drain(ctx context.Context, in <-chan inEvent) {
	left := 0
	stopped := false
	for ev := range in {
		if ev.kind != evMessage || s.ignoreLive {
			continue
		}
		s.b.m.received.WithLabelValues(sourceLive).Inc()
		back := s.wentBackLive(ev.seq)
		if !stopped && !back && s.continues(ev.seq) {
			if s.produce(ctx, ev.seq, ev.payload, false) == nil {
				continue
			}
			stopped = true
		}
		if !back && s.known && s.inOverlap(ev.seq) {
			continue // a duplicate
		}
		// A gap, or a stream that went back: left to the next bridge.
		stopped = true
		left++
	}
	if left > 0 {
		s.st.log.Info("batches received but not produced at shutdown", "count", left)
	}
}

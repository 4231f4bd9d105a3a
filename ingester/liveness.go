package ingester

import (
	"context"
	"time"
)

// The partition clock and the liveness rule (DESIGN semantics 8,
// docs/semantics.md "Liveness"), all in this file: the clock follows the
// records' Kafka timestamps while the partition is behind and wall time
// once it is caught up (the worker's tick); an endpoint silent for longer
// than the liveness window on that clock is dropped with its record,
// except while the topic is in an outage (outage.go's watch) or within the
// grace after an outage, a claim or a clock jump over a silence nobody
// consumed.

// tickInterval is how often a caught-up worker moves its clock on wall
// time.
func (w *worker) tickInterval() time.Duration {
	return min(max(w.cfg.LivenessWindow/10, 10*time.Millisecond), time.Second)
}

// onTick ages an idle, caught-up partition's endpoints on wall time and
// writes the drops of the ones that expired.
func (w *worker) onTick(ctx context.Context) error {
	if w.next < w.hwm || !w.win.empty() {
		return nil // behind: the records' own times move the clock
	}
	w.ap.advanceClock(w.cfg.Clock.Now())
	w.ap.expire()
	return w.commit(ctx)
}

// recordClock moves the partition clock for a record with Kafka
// timestamp ts and expires the endpoints silent for too long: the
// record's timestamp while the partition is behind (behind), wall time
// once caught up, and never a time in the future (a producer's clock, on a
// topic without LogAppendTime, must not expire every other endpoint or
// make one immortal).
func (a *applier) recordClock(ts time.Time, behind bool) {
	if now := a.cfg.Clock.Now(); behind && ts.Before(now) {
		a.advanceClock(ts)
	} else {
		a.advanceClock(now)
	}
	a.expire()
}

// advanceClock moves the partition clock for a record: its Kafka timestamp
// while the partition is behind, wall time once caught up; never back.
func (a *applier) advanceClock(t time.Time) {
	if t.After(a.clock) {
		prev := a.clock
		a.clock = t
		a.afterClock(prev)
	}
}

// expire drops every endpoint silent for longer than the liveness window
// on the partition clock, outage time left out, unless the topic is in an
// outage or the partition within a grace (DESIGN semantics 8).
func (a *applier) expire() {
	a.syncOutage()
	if !a.mayExpire() {
		return
	}
	if !a.minLast.IsZero() && a.clock.Sub(a.minLast) <= a.cfg.LivenessWindow {
		return
	}
	var oldest time.Time
	for _, ep := range a.eps {
		if a.silence(ep) > a.cfg.LivenessWindow {
			a.log.Info("endpoint expired", "endpoint", ep.id.String(), "last_record", ep.cur.lastRecord, "clock", a.clock,
				"outage_seconds", (a.live.credit - ep.outageCredit).Seconds())
			a.drop(ep, "expired", true)
			continue
		}
		if oldest.IsZero() || ep.cur.lastRecord.Before(oldest) {
			oldest = ep.cur.lastRecord
		}
	}
	if oldest.IsZero() {
		oldest = a.clock
	}
	a.minLast = oldest
}

// liveness is a partition's share of the outage rule (DESIGN semantics 8,
// v1.1), kept by its applier.
type liveness struct {
	// ongoing, credit and seen mirror the watch (syncOutage): an outage
	// now; the total time of the ended ones; how many ended.
	ongoing bool
	credit  time.Duration
	seen    uint64
	// graceUntil: no endpoint expires while the partition clock is not
	// past it (set after an outage and after a claim).
	graceUntil time.Time
	// claimPending: the worker has just claimed the partition; its first
	// clock value is compared with claimLast, the newest last-record time
	// of the endpoints it loaded (afterClock).
	claimPending bool
	claimLast    time.Time
}

// claimed starts the claim rule for the endpoints loaded with the
// partition; it runs once, before the first record.
func (a *applier) claimed() {
	a.syncOutage()
	a.live.claimPending = true
	for _, ep := range a.eps {
		ep.outageCredit = a.live.credit
		if ep.cur.lastRecord.After(a.live.claimLast) {
			a.live.claimLast = ep.cur.lastRecord
		}
	}
}

// syncOutage reads the outage watch, before every expiry: an outage that
// ended since the last read gives every endpoint OutageGrace from its
// end.
func (a *applier) syncOutage() {
	if a.out == nil {
		return
	}
	st := a.out.state()
	if st.ongoing && !a.live.ongoing {
		a.log.Debug("topic outage: expiry paused", "last_record", st.since)
	}
	a.live.ongoing, a.live.credit = st.ongoing, st.credit
	if st.ended != a.live.seen {
		a.live.seen = st.ended
		if until := st.lastEnd.Add(a.cfg.OutageGrace); until.After(a.live.graceUntil) {
			a.live.graceUntil = until
			a.log.Debug("topic outage ended: every endpoint gets the grace", "grace_until", until)
		}
	}
}

// afterClock applies the gap rule when the partition clock moved from
// prev: a jump of more than OutageThreshold means nobody consumed the
// partition while it had no record for that long (after a claim, prev is
// the newest last-record time loaded; in a backlog, the gap between two
// records). Once caught up, ticks move the clock by at most a second, so
// a quiet partition whose pods died makes no jump and ages them normally.
// Every endpoint then gets OutageGrace from the new clock value.
func (a *applier) afterClock(prev time.Time) {
	kind := "gap"
	if a.live.claimPending {
		a.live.claimPending = false
		prev, kind = a.live.claimLast, "claim"
	}
	if prev.IsZero() || len(a.eps) == 0 {
		return
	}
	if gap := a.clock.Sub(prev); gap > a.cfg.OutageThreshold {
		until := a.clock.Add(a.cfg.OutageGrace)
		if until.After(a.live.graceUntil) {
			a.live.graceUntil = until
		}
		a.m.outages.WithLabelValues(kind).Inc()
		a.log.Info("partition clock jumped over a silence nobody consumed: every endpoint gets the grace",
			"after", kind, "silence_seconds", gap.Seconds(), "grace_until", until, "endpoints", len(a.eps))
	}
}

// mayExpire reports whether endpoints may expire now: not during an
// outage, nor within a grace.
func (a *applier) mayExpire() bool {
	return !a.live.ongoing && a.clock.After(a.live.graceUntil)
}

// silence is how long ep has been silent on the partition clock, outage
// time left out.
func (a *applier) silence(ep *endpoint) time.Duration {
	return a.clock.Sub(ep.cur.lastRecord) - (a.live.credit - ep.outageCredit)
}

package ingester

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/events"
)

// metrics are the ingester's Prometheus metrics (subsystem "ingester").
type metrics struct {
	records prometheus.Counter
	events  *prometheus.CounterVec // by type
	// eventsByType holds events' child per events.Type, made up front
	// (workers share metrics): the label lookup hashes its value, once
	// per event.
	eventsByType   [events.TierBlocksCleared + 1]prometheus.Counter
	skippedRecords *prometheus.CounterVec // by reason (docs/semantics.md)
	skippedEvents  *prometheus.CounterVec // by reason (events.SkipReason)
	drops          *prometheus.CounterVec // by reason
	txns           *prometheus.CounterVec // by kind
	txnOps         prometheus.Histogram
	txnSeconds     prometheus.Histogram
	txnRetries     prometheus.Counter
	txnOpsLimit    prometheus.Gauge
	txnOpsWanted   prometheus.Gauge
	guardFailures  prometheus.Counter
	leases         prometheus.Gauge
	leaseGrants    prometheus.Counter
	leaseRegrants  prometheus.Counter
	leaseRecounts  prometheus.Counter
	leasesExpired  prometheus.Counter
	lag            *prometheus.GaugeVec // by partition
	partitions     prometheus.Gauge
	offsetResets   prometheus.Counter
	outages        *prometheus.CounterVec // by kind: topic, claim
	outageSeconds  prometheus.Counter
	repeatedHeader *prometheus.CounterVec // by header
	etcdFailures   *prometheus.CounterVec // by op
	fetchErrors    prometheus.Counter
	unkeyedBlocks  *prometheus.CounterVec // by reason (keying.go)
	mapEntries     *prometheus.GaugeVec   // by partition
	mapRebuilt     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "kvindex", "ingester"
	m := &metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "records_total",
			Help: "Kafka records consumed (applied, skipped and control records alike)."}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_total",
			Help: "KV events applied, by type."}, []string{"type"}),
		skippedRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "skipped_records_total",
			Help: "Records skipped whole, by reason (docs/semantics.md)."}, []string{"reason"}),
		skippedEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "skipped_events_total",
			Help: "Events skipped inside applied batches, by reason."}, []string{"reason"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "drops_total",
			Help: "Endpoint drops (every chunk of the endpoint, or of one tier, deleted), by reason (clear, tier_clear, resync, goodbye, restart, gap, incarnation, no_seq, expired, reset, stale, malformed_record, sequence_exhausted, foreign_chunks, medium_map, group_change)."}, []string{"reason"}),
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "txns_total",
			Help: "Write transactions committed, by kind (commit: a window, or its last part; part: an earlier part of a window split past etcd's bounds)."}, []string{"kind"}),
		txnOps: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "txn_ops",
			Help:    "Operations per committed write transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}),
		txnSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "txn_seconds",
			Help:    "Latency of write transactions.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}),
		txnOpsLimit: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "txn_ops_limit",
			Help: "Operations per transaction the ingester packs: --max-txn-ops, lowered at start to what etcd accepts."}),
		txnOpsWanted: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "txn_ops_configured",
			Help: "--max-txn-ops as configured; txn_ops_limit below it means etcd accepts fewer (alert KvindexTxnLimitClamped)."}),
		txnRetries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "txn_retries_total",
			Help: "Write transactions retried after an etcd error."}),
		guardFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "guard_failures_total",
			Help: "Write transactions whose owner-key guard failed (this member was fenced)."}),
		leases: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leases",
			Help: "Leases this ingester keeps alive."}),
		leaseGrants: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_grants_total",
			Help: "Leases granted."}),
		leaseRegrants: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_regrants_total",
			Help: "Leases granted again because a write found its lease expired."}),
		leaseRecounts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lease_recounts_total",
			Help: "Lease shards whose attached chunk keys were read back from etcd (a TimeToLive listing them) because their count reached --keys-per-lease."}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "leases_expired_total",
			Help: "Leases found expired while this ingester kept them alive."}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "lag_records",
			Help: "Records between a partition's high watermark and its stored next offset."}, []string{"partition"}),
		partitions: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "partitions",
			Help: "Partitions this ingester owns."}),
		offsetResets: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "offset_resets_total",
			Help: "Stored offsets found outside the log (the partition restarted at the log start)."}),
		unkeyedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "unkeyed_blocks_total",
			Help: "Blocks token mode did not key, by reason (unknown_parent, unknown_placeholder, bad_tokens, bad_extra_keys), and removals of unknown engine hashes (unknown_removal)."}, []string{"reason"}),
		mapEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "map_entries",
			Help: "Entries of the token-mode engine hash -> key maps of a partition's endpoints (bounded by --max-map-entries)."}, []string{"partition"}),
		mapRebuilt: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "map_rebuilt_entries_total",
			Help: "Token-mode map entries rebuilt from chunk values when this ingester claimed a partition."}),
		outages: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outages_total",
			Help: "Silences after which every endpoint got --outage-grace, by kind: topic (no record in the whole topic for more than --outage-threshold, counted when records flow again), claim (a partition claimed more than --outage-threshold after its last record) and gap (its clock jumped that far between two records nobody consumed in between)."}, []string{"kind"}),
		outageSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outage_seconds_total",
			Help: "Time of the ended topic outages, which aged no endpoint."}),
		repeatedHeader: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "repeated_headers_total",
			Help: "Records carrying a contract header more than once (the record is skipped, reason repeated_header), by header."}, []string{"header"}),
		etcdFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "etcd_failures_total",
			Help: "etcd calls that failed with an error no retry fixes (the ingester stops with it), by operation."}, []string{"op"}),
		fetchErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "fetch_errors_total",
			Help: "Errors Kafka fetches returned (each also logged, at most once per 10 s with the number left unlogged), offsets out of range included."}),
	}
	// The series the alerting rules select by label value exist from the
	// start (deploy/observability), so a rate over them is 0, not absent,
	// and the observability tests see them in a scrape.
	m.drops.WithLabelValues("expired")
	for t := events.BlockStored; t <= events.TierBlocksCleared; t++ {
		m.eventsByType[t] = m.events.WithLabelValues(t.String())
	}
	for _, kind := range []string{"topic", "claim", "gap"} {
		m.outages.WithLabelValues(kind)
	}
	for _, op := range []string{"range", "txn"} {
		m.etcdFailures.WithLabelValues(op)
	}
	for _, c := range []prometheus.Collector{m.records, m.events, m.skippedRecords, m.skippedEvents, m.drops, m.txns,
		m.txnOps, m.txnSeconds, m.txnOpsLimit, m.txnOpsWanted, m.txnRetries, m.guardFailures, m.leases, m.leaseGrants, m.leaseRegrants, m.leaseRecounts,
		m.leasesExpired, m.lag, m.partitions, m.offsetResets, m.unkeyedBlocks, m.mapEntries, m.mapRebuilt,
		m.outages, m.outageSeconds, m.repeatedHeader, m.etcdFailures, m.fetchErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ingester: registering metrics: %w", err)
		}
	}
	return m, nil
}

// eventsOf returns the events_total child of type t.
func (m *metrics) eventsOf(t events.Type) prometheus.Counter {
	if t == 0 || int(t) >= len(m.eventsByType) {
		return m.events.WithLabelValues(t.String())
	}
	return m.eventsByType[t]
}

func partitionLabel(p int32) string { return strconv.FormatInt(int64(p), 10) }

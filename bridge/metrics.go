package bridge

import (
	"github.com/kvindex/kvindex/internal/contract"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of the bridge's metrics.
const (
	sourceLive   = "live"
	sourceReplay = "replay"

	// resync reasons
	reasonUnhealedGap          = "unhealed_gap"           // a live gap the replay could not cover
	reasonNoReplay             = "no_replay_socket"       // a live gap without a replay socket
	reasonReconnectNoReplay    = "reconnect_no_replay"    // reconnected without a replay socket
	reasonReplayFailed         = "replay_failed"          // reconnected and the replay failed
	reasonReplayOverrun        = "replay_overrun"         // the engine's buffer no longer holds what is missing
	reasonReplayBackoff        = "replay_backoff"         // a live gap while replay is backed off after a failed heal
	reasonRecordTooLarge       = "record_too_large"       // a batch over MaxRecordBytes (or that Kafka refused as too large) was skipped
	reasonSeqBackwards         = "seq_backwards"          // the live stream went back below the cursor without a reconnection
	skipBadFrames              = "bad_frames"             // a PUB message that is not [topic, seq(8), payload]
	skipTooLarge               = "message_too_large"      // a ZMQ message over MaxMessageBytes
	skipRecordTooLarge         = "record_too_large"       // a batch over MaxRecordBytes
	skipStale                  = "stale_connection"       // live messages of a connection to a replaced engine
	replayOutcomeComplete      = "complete"               // read to the end marker
	replayOutcomeRestart       = "engine_restarted"       // the engine is a new process
	replayOutcomeHole          = "hole"                   // the answer skipped sequence numbers
	replayOutcomeError         = "error"                  // dial, timeout or malformed answer
	lostShutdown               = "shutdown_flush_timeout" // unsent when the shutdown flush gave up
	lostNoCell                 = "no_cell"                // the cell map has no cell for the record's model
	outcomeGoodbyeEngineGone   = "engine_gone"
	outcomeNoGoodbyeStillThere = "engine_still_there"
	// bind mode: why a message's topic started no stream
	topicNoMatch     = "no_match"      // the topic does not fit Config.TopicPattern
	topicBadName     = "bad_name"      // its pod or model is empty, too long or not UTF-8
	topicTooManyPods = "too_many_pods" // a new pod past Config.MaxPods
	topicBadReplay   = "bad_replay"    // the stream started, but ReplayPattern gave no endpoint for it
)

// metrics are the bridge's Prometheus metrics (subsystem "bridge").
type metrics struct {
	received       *prometheus.CounterVec // batches in, by source
	duplicates     *prometheus.CounterVec // batches in that were already produced, by source
	produced       *prometheus.CounterVec // records acknowledged by Kafka, by kind (batch, heartbeat, ...)
	replayed       prometheus.Counter     // batches produced from a replay answer
	gaps           prometheus.Counter     // live sequence gaps seen
	resyncs        *prometheus.CounterVec // resync records, by reason
	skipped        *prometheus.CounterVec // engine messages not produced, by reason
	replays        *prometheus.CounterVec // replay requests, by outcome
	engineRestarts prometheus.Counter     // new engine processes detected
	connects       prometheus.Counter     // successful connections to the PUB socket
	connected      prometheus.Gauge       // 1 while the PUB socket is connected
	lost           *prometheus.CounterVec // records given up on, by reason
	produceSeconds prometheus.Histogram   // Produce call to Kafka acknowledgement
	shutdowns      *prometheus.CounterVec // shutdowns, by outcome
	rankMismatches prometheus.Counter     // checked batches whose rank differs from DPRank
	// bind mode
	unknownTopics  *prometheus.CounterVec // messages whose topic started no stream, by reason
	pods           prometheus.Gauge       // pods (topics) with a stream
	podsRemoved    prometheus.Counter     // pods forgotten after PodIdleTimeout without a connection
	publisherConns prometheus.Gauge       // accepted publisher connections past the handshake
	refused        prometheus.Counter     // publisher connections refused at MaxConnections
	// cell map (Config.Cells)
	cellMoves prometheus.Counter // endpoints moved to another cell after a map change
}

func newMetrics(reg prometheus.Registerer, bufferedRecords, bufferedBytes, queued func() float64) (*metrics, error) {
	m := &metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_batches_received_total",
			Help: "Engine batches received, by source (live PUB socket or replay).",
		}, []string{"source"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_batches_duplicate_total",
			Help: "Engine batches received that this bridge had already produced, by source.",
		}, []string{"source"}),
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_records_produced_total",
			Help: "Records acknowledged by Kafka, by kind (batch, heartbeat, goodbye, resync).",
		}, []string{"kind"}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_batches_replayed_total",
			Help: "Batches produced from the engine's replay socket (healed gaps and catch-up).",
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_gaps_total",
			Help: "Sequence gaps seen on the live PUB stream.",
		}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_resyncs_total",
			Help: "kind=resync records produced, by reason.",
		}, []string{"reason"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_messages_skipped_total",
			Help: "Engine messages not produced, by reason.",
		}, []string{"reason"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_replay_requests_total",
			Help: "Replay requests sent to the engine, by outcome.",
		}, []string{"outcome"}),
		engineRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_engine_restarts_total",
			Help: "New engine processes detected (sequence restarted).",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_engine_connects_total",
			Help: "Connections made to the engine's PUB socket (bind mode: pods taken up by a connection).",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_bridge_engine_connected",
			Help: "Dial mode: 1 while the engine's PUB socket is connected, else 0. Bind mode: the pods a connection carries.",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_records_lost_total",
			Help: "Records given up on, by reason.",
		}, []string{"reason"}),
		produceSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_bridge_produce_seconds",
			Help:    "Time from handing a record to the Kafka client to its acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		shutdowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_shutdowns_total",
			Help: "Shutdowns, by outcome (engine_gone: goodbye sent; engine_still_there: sidecar-only restart).",
		}, []string{"outcome"}),
		rankMismatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_dp_rank_mismatches_total",
			Help: "Batches (the first after each connection is checked) whose data_parallel_rank differs from the configured dp_rank.",
		}),
		unknownTopics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_bridge_unknown_topics_total",
			Help: "Bind mode: messages whose topic started no stream, by reason (no_match, bad_name, too_many_pods), and pods whose replay endpoint could not be made (bad_replay).",
		}, []string{"reason"}),
		pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_bridge_pods",
			Help: "Bind mode: pods (topics) the bridge keeps a stream for (bounded by max-pods).",
		}),
		podsRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_pods_removed_total",
			Help: "Bind mode: pods forgotten after pod-idle-timeout without a connection.",
		}),
		publisherConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_bridge_publisher_connections",
			Help: "Bind mode: publisher connections open (past the ZMTP handshake).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_connections_refused_total",
			Help: "Bind mode: publisher connections closed at once because max-connections were open.",
		}),
		cellMoves: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_bridge_cell_moves_total",
			Help: "Cell map: endpoints moved to another cell after a map change (goodbye in the old cell, resync in the new).",
		}),
	}
	// Every label value the bridge uses starts at 0, so each series
	// exists before its first event (a rate over it is 0, not absent, and
	// a test reading a renamed series fails instead of reading 0).
	for vec, values := range map[*prometheus.CounterVec][]string{
		m.received:   {sourceLive, sourceReplay},
		m.duplicates: {sourceLive, sourceReplay},
		m.produced:   {"batch", contract.KindHeartbeat, contract.KindGoodbye, contract.KindResync},
		m.resyncs: {reasonUnhealedGap, reasonNoReplay, reasonReconnectNoReplay, reasonReplayFailed,
			reasonReplayOverrun, reasonReplayBackoff, reasonRecordTooLarge, reasonSeqBackwards},
		m.skipped:       {skipBadFrames, skipTooLarge, skipRecordTooLarge, skipStale},
		m.replays:       {replayOutcomeComplete, replayOutcomeRestart, replayOutcomeHole, replayOutcomeError},
		m.lost:          {lostShutdown, lostNoCell},
		m.shutdowns:     {outcomeGoodbyeEngineGone, outcomeNoGoodbyeStillThere},
		m.unknownTopics: {topicNoMatch, topicBadName, topicTooManyPods, topicBadReplay},
	} {
		for _, v := range values {
			vec.WithLabelValues(v)
		}
	}
	if reg == nil {
		return m, nil
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindex_bridge_buffered_records",
			Help: "Records held by the Kafka client, not yet acknowledged (bounded by MaxBufferedRecords).",
		}, bufferedRecords),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindex_bridge_buffered_bytes",
			Help: "Bytes held by the Kafka client, not yet acknowledged (bounded by MaxBufferedBytes).",
		}, bufferedBytes),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindex_bridge_queued_messages",
			Help: "Engine messages and records waiting in the bridge's internal queues (bounded by 2 × QueueSize).",
		}, queued),
	}
	for _, c := range append([]prometheus.Collector{
		m.received, m.duplicates, m.produced, m.replayed, m.gaps, m.resyncs, m.skipped, m.replays,
		m.engineRestarts, m.connects, m.connected, m.lost, m.produceSeconds, m.shutdowns, m.rankMismatches,
		m.unknownTopics, m.pods, m.podsRemoved, m.publisherConns, m.refused, m.cellMoves,
	}, gauges...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

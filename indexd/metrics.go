package indexd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/index"
)

// metrics are indexd's Prometheus metrics (subsystem "indexd").
type metrics struct {
	requests       *prometheus.CounterVec
	requestSeconds *prometheus.HistogramVec
	barrierSeconds prometheus.Histogram
	barrierWaiters prometheus.Gauge
	watchEvents    *prometheus.CounterVec
	malformed      *prometheus.CounterVec
	lists          *prometheus.CounterVec
	listSeconds    prometheus.Histogram
	listedKeys     prometheus.Counter
	watchRestarts  prometheus.Counter
	ready          prometheus.Gauge
	inflightBlocks prometheus.Gauge
	staleWarnings  prometheus.Counter
	tokenLeftOut   prometheus.Counter
	// requestReadTimeouts counts calls cancelled by requestRead.
	requestReadTimeouts prometheus.Counter
}

// newMetrics builds the metrics and registers them, with gauges that read
// the current index through cur and the progress age through progressAge,
// on reg (when non-nil).
func newMetrics(reg prometheus.Registerer, cur func() *index.Index, progressAge func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_indexd_requests_total",
			Help: "gRPC calls served, by method and status code.",
		}, []string{"method", "code"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvindex_indexd_request_seconds",
			Help:    "Time to answer a gRPC call, barrier wait included, by method.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2.5, 14),
		}, []string{"method"}),
		barrierSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_indexd_barrier_wait_seconds",
			Help:    "Time Lookup calls with a barrier waited for it (met or not).",
			Buckets: prometheus.ExponentialBuckets(1e-4, 3, 12),
		}),
		barrierWaiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_indexd_barrier_waiters",
			Help: "Lookup calls waiting on a barrier now (at most --max-barrier-waiters; past it calls fail RESOURCE_EXHAUSTED).",
		}),
		watchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_indexd_watch_events_total",
			Help: "etcd watch events applied, by key kind (chunks, endpoints, offsets, owners, ingesters, members, blocks: v1 keys, skipped; unknown).",
		}, []string{"kind"}),
		malformed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_indexd_malformed_total",
			Help: "Keys or values under the prefix that could not be indexed and were skipped, by key kind.",
		}, []string{"kind"}),
		lists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindex_indexd_lists_total",
			Help: "Complete lists of etcd applied, by reason: start (the first), compacted (a re-list after the watch fell behind a compaction) or prev_kv_missing (a re-list after a chunk event came without its previous value).",
		}, []string{"reason"}),
		listSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindex_indexd_list_seconds",
			Help:    "Time to list etcd into a fresh index.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		listedKeys: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_indexd_listed_keys_total",
			Help: "Keys read by lists.",
		}),
		watchRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_indexd_watch_restarts_total",
			Help: "Broken watches resumed from the last applied revision + 1 without a re-list.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_indexd_ready",
			Help: "1 once the first list is applied and the replica serves, else 0.",
		}),
		inflightBlocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindex_indexd_inflight_blocks",
			Help: "Blocks of the Lookups being answered now (at most --max-inflight-blocks; past it Lookups fail RESOURCE_EXHAUSTED).",
		}),
		staleWarnings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_indexd_stale_total",
			Help: "Times the last progress from etcd grew older than --stale-log-after, or a list of etcd went unanswered that long (each logged).",
		}),
		requestReadTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_indexd_request_read_timeouts_total",
			Help: "Calls cancelled because their request message had not arrived within --request-read-timeout of their headers (either port).",
		}),
		tokenLeftOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindex_indexd_token_lookup_left_out_total",
			Help: "Endpoints left out of token Lookups: their model's candidates had more than 4 block sizes, and theirs was not among the 4 whose endpoints hold the most blocks.",
		}),
	}
	if reg == nil {
		return m
	}
	stat := func(name, help string, f func(*index.Index) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if ix := cur(); ix != nil {
				return f(ix)
			}
			return 0
		})
	}
	reg.MustRegister(m.requests, m.requestSeconds, m.barrierSeconds, m.barrierWaiters, m.watchEvents, m.malformed,
		m.lists, m.listSeconds, m.listedKeys, m.watchRestarts, m.ready, m.inflightBlocks, m.staleWarnings, m.tokenLeftOut, m.requestReadTimeouts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvindex_indexd_progress_age_seconds",
			Help: "Seconds since the replica last heard from etcd that its watch was current (progress notification, watch event or list); 0 before the first list.",
		}, progressAge),
		stat("kvindex_indexd_revision", "etcd revision the serving index reflects.",
			func(ix *index.Index) float64 { return float64(ix.Revision()) }),
		stat("kvindex_indexd_entries", "Present (block, endpoint, tier) entries in the serving index.",
			func(ix *index.Index) float64 { return float64(ix.Stats().Entries) }),
		stat("kvindex_indexd_endpoints", "Endpoints in the serving index.",
			func(ix *index.Index) float64 { return float64(ix.Stats().Endpoints) }),
		newModelCollector(cur),
		stat("kvindex_indexd_set_arena_bytes", "Bytes of endpoint sets (blocks held by several endpoints) in the serving index.",
			func(ix *index.Index) float64 { return float64(4 * ix.Stats().SetWords) }),
		stat("kvindex_indexd_duplicate_holds", "Holds of a (block, endpoint, tier) by a chunk beyond the first chunk holding it: 0 while writers keep the chunk rule; above 0 for longer than a window, a chunk in etcd breaks it (kvindex inspect chunks names it; the ingester repairs it when it next rebuilds the endpoint).",
			func(ix *index.Index) float64 { return float64(ix.Stats().Duplicates) }),
	)
	return m
}

package indexd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/tier"
)

// MaxModelSeries bounds the models kvindex_indexd_model_endpoints and
// kvindex_indexd_model_blocks report one by one (docs/limits.md): the
// first models in name order; the endpoints and blocks of the rest are
// summed under model="_other", so a fleet of many models (or a flood of
// hostile model names) costs at most this many series per tier.
const MaxModelSeries = 200

// otherModels is the model label of the models past MaxModelSeries.
const otherModels = "_other"

// modelCollector reports the serving index's endpoints and blocks per
// model and tier at each scrape, from ListEndpoints (O(n log n) in the
// endpoints, the cost of one ListEndpoints page).
type modelCollector struct {
	cur       func() *index.Index
	endpoints *prometheus.Desc
	blocks    *prometheus.Desc
}

func newModelCollector(cur func() *index.Index) *modelCollector {
	return &modelCollector{
		cur: cur,
		endpoints: prometheus.NewDesc("kvindex_indexd_model_endpoints",
			"Endpoints in the serving index, by model (the first 200 models by name; the rest under model=\"_other\").",
			[]string{"model"}, nil),
		blocks: prometheus.NewDesc("kvindex_indexd_model_blocks",
			"Blocks held in the serving index, by model and tier (gpu, cpu, disk), counted once per endpoint holding them.",
			[]string{"model", "tier"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *modelCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.endpoints
	ch <- c.blocks
}

// Collect implements prometheus.Collector.
func (c *modelCollector) Collect(ch chan<- prometheus.Metric) {
	ix := c.cur()
	if ix == nil {
		return
	}
	type sums struct {
		endpoints int
		blocks    [tier.Count]uint64
	}
	var order []string
	by := map[string]*sums{}
	infos, _ := ix.ListEndpoints("")
	for _, e := range infos {
		m := e.Endpoint.Model
		s := by[m]
		if s == nil {
			if len(order) >= MaxModelSeries {
				m = otherModels
			}
			if s = by[m]; s == nil {
				s = &sums{}
				by[m] = s
				order = append(order, m)
			}
		}
		s.endpoints++
		for t := range s.blocks {
			s.blocks[t] += e.Blocks[t]
		}
	}
	for _, m := range order {
		s := by[m]
		ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(s.endpoints), m)
		for i, t := range tier.All {
			ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(s.blocks[i]), m, t.String())
		}
	}
}

package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// CounterValue gathers reg and returns the value of the counter series
// named name (its full name, namespace included) whose labels include
// every pair of labels; nil labels match the first series. A missing
// series fails the test: a renamed metric must not read as zero.
func CounterValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	return series(t, reg, "counter", name, labels).GetCounter().GetValue()
}

// GaugeValue is CounterValue for a gauge.
func GaugeValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	return series(t, reg, "gauge", name, labels).GetGauge().GetValue()
}

// series finds the series of name whose labels include labels (nil: the
// first), failing the test when there is none.
func series(t testing.TB, reg prometheus.Gatherer, kind, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			return m
		}
	}
	t.Fatalf("no %s %s%v in the registry", kind, name, labels)
	return nil
}

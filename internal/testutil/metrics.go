package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// CounterValue gathers reg and returns the value of the counter series
// named name (its full name, namespace included) whose labels include
// every pair of labels; nil labels match the first series. A missing
// series fails the test: a renamed metric must not read as zero.
func CounterValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
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
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s%v in the registry", name, labels)
	return 0
}

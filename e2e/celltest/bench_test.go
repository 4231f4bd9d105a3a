package celltest

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// spreadMap spreads each model kK over the first K of the cells.
func spreadMap(t testing.TB, cells []*cell, ks []int) *cellmap.Map {
	t.Helper()
	doc := `{"cells": [`
	for i, c := range cells {
		if i > 0 {
			doc += ", "
		}
		doc += fmt.Sprintf(`{"name": %q, "indexd": %q, "topic": %q}`, c.name, c.indexdAddr, c.topic)
	}
	doc += `], "models": [`
	for i, k := range ks {
		if i > 0 {
			doc += ", "
		}
		var names []string
		for _, c := range cells[:k] {
			names = append(names, fmt.Sprintf("%q", c.name))
		}
		doc += fmt.Sprintf(`{"match": "k%d", "cells": [%s]}`, k, joinComma(names))
	}
	m, err := cellmap.Parse([]byte(doc + "]}"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

// BenchmarkFanOutLookup measures a Lookup of a model spread over K = 1, 2
// and 4 cells through a cell-mode client against the same Lookup of the
// same endpoints on one reference cell that holds them all, alternating
// the two call by call in one run. It reports each side's p50 and p99
// and their ratios.
func BenchmarkFanOutLookup(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Minute))
	defer cancel()
	names := []string{"a", "b", "c", "d", "ref"}
	var topics []string
	for _, n := range names {
		topics = append(topics, "cell-"+n)
	}
	k := testutil.StartKafka(b, topics[0], 4, kfake.SeedTopics(4, topics[1:]...))
	var cells []*cell
	for i, n := range names {
		cells = append(cells, startCell(b, ctx, n, topics[i], k.Brokers))
	}
	ref := cells[4]
	ks := []int{1, 2, 4}
	m := spreadMap(b, cells[:4], ks)

	// One fleet stream (one model, 32 pods of 2 ranks), copied under each
	// model kK; the reference gets every copy.
	recs := refmodel.Generate(refmodel.GenConfig{Seed: 7, Records: 4000, Models: 1, Pods: 32, Universe: 256, Start: time.Now()})
	byTopic := map[string][]refmodel.Record{}
	for _, kk := range ks {
		model := fmt.Sprintf("k%d", kk)
		for _, r := range recs {
			h := map[string]string{}
			for key, v := range r.Headers {
				h[key] = v
			}
			if _, ok := h["model"]; ok {
				h["model"] = model
			}
			r.Headers = h
			c, err := m.WriteCell(model, r.Key)
			if err != nil {
				b.Fatal(err)
			}
			byTopic[c.Topic] = append(byTopic[c.Topic], r)
			byTopic[ref.topic] = append(byTopic[ref.topic], r)
		}
	}
	prod := ingesttest.NewProducer(b, k.Brokers)
	for _, c := range cells {
		offs := ingesttest.Produce(b, ctx, prod, c.topic, byTopic[c.topic])
		ingesttest.WaitApplied(b, ctx, c.cli, ks2, c.topic, offs)
	}
	refClient, err := client.New(ref.indexdAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer refClient.Close()
	cellClient, err := client.New("", client.WithCells(m))
	if err != nil {
		b.Fatal(err)
	}
	defer cellClient.Close()

	// Query prefixes: every endpoint's stored blocks of k1, 4 at a time.
	var hashes [][]uint64
	for _, bl := range ingesttest.Blocks(b, ctx, ref.cli, ks2) {
		if bl.Endpoint.Model == "k1" && len(hashes) < 256 {
			hashes = append(hashes, []uint64{bl.Hash})
		}
	}
	// Let every indexd catch up: the answers must be equal before timing.
	for _, kk := range ks {
		model := fmt.Sprintf("k%d", kk)
		waitFor(b, ctx, "fan-out equals the reference", func() (string, bool) {
			for _, h := range hashes {
				w, err1 := refClient.Lookup(ctx, model, h)
				g, err2 := cellClient.Lookup(ctx, model, h)
				if err1 != nil || err2 != nil || len(w.Matches) != len(g.Matches) {
					return fmt.Sprintf("%s %x: %v %v", model, h, err1, err2), false
				}
			}
			return "", true
		})
	}
	const samples = 3000
	for _, kk := range ks {
		model := fmt.Sprintf("k%d", kk)
		b.Run(fmt.Sprintf("K=%d", kk), func(b *testing.B) {
			var fan, one []time.Duration
			for b.Loop() {
				fan, one = fan[:0], one[:0]
				for i := range samples {
					h := hashes[i%len(hashes)]
					start := time.Now()
					if _, err := cellClient.Lookup(ctx, model, h); err != nil {
						b.Fatal(err)
					}
					fan = append(fan, time.Since(start))
					start = time.Now()
					if _, err := refClient.Lookup(ctx, model, h); err != nil {
						b.Fatal(err)
					}
					one = append(one, time.Since(start))
				}
			}
			slices.Sort(fan)
			slices.Sort(one)
			p := func(d []time.Duration, q float64) float64 { return float64(d[int(q*float64(len(d)-1))].Microseconds()) }
			b.ReportMetric(p(fan, 0.5), "fanout-p50-µs")
			b.ReportMetric(p(fan, 0.99), "fanout-p99-µs")
			b.ReportMetric(p(one, 0.5), "single-p50-µs")
			b.ReportMetric(p(one, 0.99), "single-p99-µs")
			b.ReportMetric(p(fan, 0.5)/p(one, 0.5), "p50-ratio")
			b.ReportMetric(p(fan, 0.99)/p(one, 0.99), "p99-ratio")
		})
	}
}

// ks2 is the keyspace (ks in cells_test.go), named apart from the
// benchmark's K list.
var ks2 = ks

// cpu returns this process's user + system CPU time.
func cpu(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCellsCPUPerOp ingests one fleet stream into one cell, then
// into N = 3 fresh cells each fed its third (routed by a cell map as the
// bridges route it), and reports the process CPU (etcd, ingesters,
// indexd watches, the kfake broker and the producer, all in this
// process) per record of each, and their ratio. Both arms process the
// same records, so the ratio is also that of CPU per block op.
func BenchmarkCellsCPUPerOp(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Minute))
	defer cancel()
	recs := refmodel.Generate(refmodel.GenConfig{Seed: 11, Records: 20000, Models: 6, Pods: 48, Universe: 512, Start: time.Now()})
	for b.Loop() {
		arm := func(n int) time.Duration {
			var topics []string
			for i := range n {
				topics = append(topics, fmt.Sprintf("arm%d-cell-%d", n, i))
			}
			k := testutil.StartKafka(b, topics[0], 4, kfake.SeedTopics(4, topics[1:]...))
			var cells []*cell
			for i, tp := range topics {
				cells = append(cells, startCell(b, ctx, fmt.Sprintf("c%d", i), tp, k.Brokers))
			}
			m := spreadMapAll(b, cells)
			byTopic := map[string][]refmodel.Record{}
			for _, r := range recs {
				c, err := m.WriteCell(r.Headers["model"], r.Key)
				if err != nil {
					b.Fatal(err)
				}
				byTopic[c.Topic] = append(byTopic[c.Topic], r)
			}
			prod := ingesttest.NewProducer(b, k.Brokers)
			start := cpu(b)
			offs := map[string]ingesttest.Offsets{}
			for _, c := range cells {
				offs[c.topic] = ingesttest.Produce(b, ctx, prod, c.topic, byTopic[c.topic])
			}
			for _, c := range cells {
				ingesttest.WaitApplied(b, ctx, c.cli, ks2, c.topic, offs[c.topic])
			}
			used := cpu(b) - start
			for _, c := range cells {
				c.stop()
			}
			return used
		}
		one := arm(1)
		three := arm(3)
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(len(recs)) / 1e3 }
		b.ReportMetric(per(one), "1cell-cpu-µs/record")
		b.ReportMetric(per(three), "3cells-cpu-µs/record")
		b.ReportMetric(float64(three)/float64(one), "3cells/1cell")
	}
}

// spreadMapAll spreads every model over all cells by pod.
func spreadMapAll(t testing.TB, cells []*cell) *cellmap.Map {
	t.Helper()
	doc := `{"cells": [`
	var names []string
	for i, c := range cells {
		if i > 0 {
			doc += ", "
		}
		doc += fmt.Sprintf(`{"name": %q, "indexd": %q, "topic": %q}`, c.name, c.indexdAddr, c.topic)
		names = append(names, fmt.Sprintf("%q", c.name))
	}
	doc += fmt.Sprintf(`], "models": [{"match": "*", "cells": [%s]}]}`, joinComma(names))
	m, err := cellmap.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

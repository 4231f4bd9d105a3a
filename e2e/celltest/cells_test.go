package celltest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/twmb/franz-go/pkg/kfake"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

// cell is one running cell: etcd, an ingester of the cell's topic and an
// indexd, each run under the cell's context.
type cell struct {
	name, topic string
	dir         string
	etcd        *etcdembed.Server
	etcdAddr    string
	cli         *clientv3.Client
	indexdAddr  string
	stop        func()
}

var ks = keyspace.Default()

func startEtcd(t testing.TB, ctx context.Context, dir, addr string) *etcdembed.Server {
	t.Helper()
	srv, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: dir, ClientAddr: addr, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// startCells starts one kfake broker holding the topics cell-a, cell-b,
// cell-c and reference (4 partitions each) and a cell on each: a, b, c
// and the single-cell reference, ref.
func startCells(t testing.TB, ctx context.Context) (*testutil.Kafka, map[string]*cell) {
	t.Helper()
	topics := []string{"cell-a", "cell-b", "cell-c", "reference"}
	k := testutil.StartKafka(t, topics[0], 4, kfake.SeedTopics(4, topics[1:]...))
	cells := map[string]*cell{}
	for i, name := range []string{"a", "b", "c", "ref"} {
		cells[name] = startCell(t, ctx, name, topics[i], k.Brokers)
	}
	return k, cells
}

func startCell(t testing.TB, ctx context.Context, name, topic string, brokers []string) *cell {
	t.Helper()
	c := &cell{name: name, topic: topic, dir: filepath.Join(t.TempDir(), "etcd")}
	c.etcd = startEtcd(t, ctx, c.dir, "127.0.0.1:0")
	u := c.etcd.ClientURL()
	c.etcdAddr = u[len("http://"):]
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	c.cli = cli
	icfg := ingester.DefaultConfig()
	icfg.Etcd, icfg.Keyspace, icfg.Brokers, icfg.Topic = cli, ks, brokers, topic
	icfg.Group, icfg.ID = "kvindex-"+name, "ingester-"+name
	icfg.LivenessWindow = time.Hour
	in, err := ingester.New(icfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	xcfg := indexd.DefaultConfig()
	xcfg.Etcd, xcfg.Keyspace, xcfg.Listener = cli, ks, lis
	srv, err := indexd.New(xcfg)
	if err != nil {
		t.Fatal(err)
	}
	c.indexdAddr = lis.Addr().String()
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{in.Run, srv.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(cctx); err != nil && cctx.Err() == nil {
				t.Errorf("cell %s: %v", name, err)
			}
		}()
	}
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			cli.Close()
			if c.etcd != nil {
				c.etcd.Close()
			}
		})
	}
	t.Cleanup(c.stop)
	return c
}

// models are the six models of refmodel's generator (GenConfig.Models 6).
func modelName(i int) string { return fmt.Sprintf("org-%d/model %d", i, i) }

// mapDoc puts model 0 over cells a and b (spread by pod), model 1 by a
// glob in b, models 2 and 3 in a and c by name, and the rest (4, 5) in the
// default cell c. Model 3's cells are rule3.
// rule3 is the rest of model 3's rule after its match.
func mapDoc(cells map[string]*cell, rule3 string) string {
	return fmt.Sprintf(`{
  "cells": [
    {"name": "a", "indexd": %q, "topic": "cell-a"},
    {"name": "b", "indexd": %q, "topic": "cell-b"},
    {"name": "c", "indexd": %q, "topic": "cell-c"}
  ],
  "models": [
    {"match": %q, "cells": ["a", "b"]},
    {"match": "org-1/*", "cells": ["b"]},
    {"match": %q, "cells": ["a"]},
    {"match": %q, %s}
  ],
  "default": "c"
}
`, cells["a"].indexdAddr, cells["b"].indexdAddr, cells["c"].indexdAddr, modelName(0), modelName(2), modelName(3), rule3)
}

// query is one Lookup both sides answer.
type query struct {
	model  string
	hashes []uint64
}

// queries are, for every endpoint the reference holds, its first stored
// block alone and its first four blocks in key order, of its model.
func queries(t *testing.T, ctx context.Context, ref *cell) []query {
	t.Helper()
	per := map[keyspace.Endpoint][]uint64{}
	for _, b := range ingesttest.Blocks(t, ctx, ref.cli, ks) {
		per[b.Endpoint] = append(per[b.Endpoint], b.Hash)
	}
	var out []query
	for ep, hs := range per {
		sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
		out = append(out, query{ep.Model, hs[:1]}, query{ep.Model, hs[:min(4, len(hs))]})
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

// TestCellsMatchTheReference feeds three cells (by the cell map) and a
// single-cell reference (everything) the same generated fleet stream;
// every Lookup through the cell map must equal the reference's. Then cell
// b's etcd stops: only its models degrade (the spread model's answers are
// partial, naming b, and hold exactly the reference's endpoints of cell
// a; model 1, in b alone, answers stale, its ProgressTime stopped, as a
// one-target client's would), the rest answer as before; after b's etcd returns,
// everything equals the reference again.
func TestCellsMatchTheReference(t *testing.T) {
	if testing.Short() {
		t.Skip("four embedded etcd clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	k, cells := startCells(t, ctx)
	ref := cells["ref"]
	path := filepath.Join(t.TempDir(), "cells.json")
	if err := os.WriteFile(path, []byte(mapDoc(cells, `"cells": ["c"]`)), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := cellmap.NewWatcher(cellmap.WatcherConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	m := w.Current()

	// The stream: six models, four pods each (two ranks), records routed
	// as the bridge routes them (WriteCell of model and pod).
	recs := refmodel.Generate(refmodel.GenConfig{Seed: 29, Records: 3000, Models: 6, Pods: 24, Start: time.Now()})
	byTopic := map[string][]refmodel.Record{}
	spreadCells := map[string]bool{}
	for _, r := range recs {
		c, err := m.WriteCell(r.Headers["model"], r.Key)
		if err != nil {
			t.Fatal(err)
		}
		byTopic[c.Topic] = append(byTopic[c.Topic], r)
		byTopic["reference"] = append(byTopic["reference"], r)
		if r.Headers["model"] == modelName(0) {
			spreadCells[c.Name] = true
		}
	}
	if !spreadCells["a"] || !spreadCells["b"] {
		t.Fatalf("the spread model's pods landed in cells %v only; the test needs both a and b", spreadCells)
	}
	prod := ingesttest.NewProducer(t, k.Brokers)
	byName := map[string]*cell{"cell-a": cells["a"], "cell-b": cells["b"], "cell-c": cells["c"], "reference": ref}
	for topic, rs := range byTopic {
		offs := ingesttest.Produce(t, ctx, prod, topic, rs)
		ingesttest.WaitApplied(t, ctx, byName[topic].cli, ks, topic, offs)
	}

	refClient, err := client.New(ref.indexdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer refClient.Close()
	cellClient, err := client.New("", client.WithCells(w), client.WithStaleAfter(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cellClient.Close()

	qs := queries(t, ctx, ref)
	if len(qs) < 24 {
		t.Fatalf("only %d queries: the stream left too few blocks", len(qs))
	}
	// Wait until every indexd has caught up with its etcd (the offsets
	// are in etcd; the watch follows within its progress interval).
	equal := func() (string, bool) {
		for _, q := range qs {
			want, err := refClient.Lookup(ctx, q.model, q.hashes)
			if err != nil {
				return err.Error(), false
			}
			got, err := cellClient.Lookup(ctx, q.model, q.hashes)
			if err != nil {
				return fmt.Sprintf("%s: %v", q.model, err), false
			}
			if got.Partial() {
				return fmt.Sprintf("%s: partial: %v", q.model, got.Failed), false
			}
			if d := cmp.Diff(want.Matches, got.Matches); d != "" {
				return fmt.Sprintf("Lookup(%q, %x) (-reference +cells):\n%s", q.model, q.hashes, d), false
			}
		}
		return "", true
	}
	waitFor(t, ctx, "every Lookup equals the reference", equal)

	// Cell b's etcd stops.
	cells["b"].etcd.Close()
	cells["b"].etcd = nil
	inCellA := func(pod string) bool { return cellmap.PodCell([]string{"a", "b"}, pod) == "a" }
	degraded := func() (string, bool) {
		for _, q := range qs {
			want, err := refClient.Lookup(ctx, q.model, q.hashes)
			if err != nil {
				return err.Error(), false
			}
			got, err := cellClient.Lookup(ctx, q.model, q.hashes)
			switch q.model {
			case modelName(1): // only in b: stale (as a one-target answer would be) or failing
				if err == nil && time.Since(got.ProgressTime) <= 2*time.Second {
					return q.model + " still answers fresh", false
				}
				continue
			case modelName(0): // spread over a and b: partial
				if err != nil {
					return fmt.Sprintf("%s: %v", q.model, err), false
				}
				if !got.Partial() || len(got.Failed) != 1 || got.Failed[0].Cell != "b" {
					return fmt.Sprintf("%s: Failed = %v, want cell b", q.model, got.Failed), false
				}
				var wantA []client.Match
				for _, mt := range want.Matches {
					if inCellA(mt.Endpoint.Pod) {
						wantA = append(wantA, mt)
					}
				}
				if d := cmp.Diff(wantA, got.Matches); d != "" {
					t.Fatalf("partial Lookup(%q, %x) (-reference's cell-a endpoints +cells):\n%s", q.model, q.hashes, d)
				}
				continue
			}
			if err != nil || got.Partial() {
				t.Fatalf("%s (not in cell b) degraded: %v %v", q.model, err, got)
			}
			if d := cmp.Diff(want.Matches, got.Matches); d != "" {
				t.Fatalf("Lookup(%q, %x) of a model outside cell b (-reference +cells):\n%s", q.model, q.hashes, d)
			}
		}
		return "", true
	}
	waitFor(t, ctx, "only cell b's models degrade", degraded)

	// Cell b's etcd returns on its data and address.
	cells["b"].etcd = startEtcd(t, ctx, cells["b"].dir, cells["b"].etcdAddr)
	waitFor(t, ctx, "every Lookup equals the reference after cell b recovers", equal)

	// The map file changes while everything runs: model 3 (in c) is read
	// from a too, as in the first step of a move.
	changed := w.Changed()
	doc := mapDoc(cells, `"cells": ["c"], "readAlso": ["a"]`)
	if err := os.WriteFile(path+".tmp", []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	if !w.Reload() {
		_, _, lastErr := w.Stats()
		t.Fatalf("the changed map was not loaded: %v", lastErr)
	}
	<-changed
	if r, _ := w.Current().Route(modelName(3)); len(r.Read) != 2 {
		t.Fatalf("model 3's route after the change = %+v, want cells c and a", r)
	}
	waitFor(t, ctx, "every Lookup equals the reference after the map changed", equal)
}

// waitFor polls cond until it holds or ctx ends (then fails with its last
// reason).
func waitFor(t testing.TB, ctx context.Context, what string, cond func() (string, bool)) {
	t.Helper()
	for {
		why, ok := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not before the deadline: %s", what, why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

package indexd

import (
	"context"
	"fmt"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
)

// mirror writes the state of a reference model into etcd as the ingester
// would (block keys, endpoint records, an advancing offset), as the
// difference from what it wrote last, in bounded transactions.
type mirror struct {
	t       *testing.T
	w       *writer
	written map[keyspace.Block]bool
	records map[keyspace.Endpoint]bool
}

func newMirror(t *testing.T, w *writer) *mirror {
	return &mirror{t: t, w: w, written: map[keyspace.Block]bool{}, records: map[keyspace.Endpoint]bool{}}
}

// sync makes etcd hold exactly m's blocks and endpoints.
func (mr *mirror) sync(m *refmodel.Model) {
	mr.t.Helper()
	const maxOps = 127 // plus the offset: etcd's default --max-txn-ops
	var ops []any
	flush := func() {
		mr.w.commit(ops...)
		ops = nil
	}
	add := func(op any) {
		if ops = append(ops, op); len(ops) == maxOps {
			flush()
		}
	}
	now := map[keyspace.Block]bool{}
	for _, b := range m.Blocks() {
		now[b] = true
		if !mr.written[b] {
			add(mr.w.put(b))
		}
	}
	for b := range mr.written {
		if !now[b] {
			add(mr.w.del(b))
		}
	}
	mr.written = now
	eps := map[keyspace.Endpoint]bool{}
	for _, ep := range m.Endpoints() {
		eps[ep] = true
		if !mr.records[ep] {
			add(mr.w.record(ep, keyspace.EndpointRecord{LastRecord: time.Unix(1700000000, 0).UTC()}))
		}
	}
	for ep := range mr.records {
		if !eps[ep] {
			add(clientv3.OpDelete(mr.w.ks.EndpointKey(ep)))
		}
	}
	mr.records = eps
	flush() // always advances the offset, so a barrier can name it
}

// clientLookup runs Lookup through the client library with a barrier on
// the writer's last record and returns the matches in scenario terms.
func clientLookup(t *testing.T, c *client.Client, w *writer, model string, hashes []uint64) []scenario.Match {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	res, err := c.Lookup(ctx, model, hashes, client.WithBarrier(0, client.PartitionOffset{Topic: w.part.Topic, Partition: w.part.Partition, Offset: w.next - 1}))
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	out := make([]scenario.Match, 0, len(res.Matches))
	for _, m := range res.Matches {
		ts := make([]string, len(m.Tiers))
		for i, x := range m.Tiers {
			ts[i] = x.String()
		}
		out = append(out, scenario.Match{Pod: m.Endpoint.Pod, DPRank: m.Endpoint.DPRank, Blocks: m.Blocks, Tiers: ts})
	}
	return out
}

// TestScenarioFixtures replays every scenario of testdata/fixtures through
// the reference model, mirrors the model's state into etcd key by key, and
// checks that indexd, asked through the client library, answers each
// lookup step as the fixture expects. (The whole pipeline, with Kafka and
// the ingester, is the e2e suite's; this pins indexd's half.)
func TestScenarioFixtures(t *testing.T) {
	scenarios, err := scenario.Glob(testutil.ScenarioGlob(t))
	if err != nil {
		t.Fatal(err)
	}
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	c, err := client.New(r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := newWriter(t, e.Client)
	mr := newMirror(t, w)
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			mr.t = t
			w.t = t
			m := refmodel.New(refmodel.Config{HashMode: keyspace.HashMode(sc.HashMode)})
			mr.sync(m) // each file starts from an empty index
			for _, step := range sc.Steps {
				switch step.Kind {
				case scenario.KindPublish:
					p := step.Publish
					m.Apply(refmodel.Record{Key: p.Key, Headers: p.Headers, Value: p.Value, Time: time.Unix(1700000000, 0)})
				case scenario.KindLookup:
					mr.sync(m)
					got := clientLookup(t, c, w, step.Lookup.Model, step.Lookup.Keys())
					if diffs := scenario.Compare(step.Lookup.Expect, got); diffs != nil {
						t.Errorf("line %d (%s): %v", step.Line, step.Lookup.Describe, diffs)
					}
				}
			}
		})
	}
}

// TestRefmodelRandomStream feeds a seeded random record stream (every rule
// of docs/semantics.md, garbage included) to the reference model, mirrors
// its state into etcd every few records, and compares indexd's answers for
// prefixes of the stream's own hashes with the reference model's.
func TestRefmodelRandomStream(t *testing.T) {
	seed := testutil.Seed(t)
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	c, err := client.New(r.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := newWriter(t, e.Client)
	mr := newMirror(t, w)
	m := refmodel.New(refmodel.Config{})
	records := refmodel.Generate(refmodel.GenConfig{Seed: seed, Records: 400})
	for i, rec := range records {
		m.Apply(rec)
		if i%40 != 39 {
			continue
		}
		mr.sync(m)
		// Query each model with each present endpoint's blocks in hash
		// order and with every hash the model holds.
		byModel := map[string][]uint64{}
		for _, b := range m.Blocks() {
			byModel[b.Endpoint.Model] = append(byModel[b.Endpoint.Model], b.Hash)
		}
		for model, hashes := range byModel {
			for _, q := range [][]uint64{hashes, hashes[:len(hashes)/2], hashes[len(hashes)/3:]} {
				if len(q) > DefaultMaxHashes {
					q = q[:DefaultMaxHashes]
				}
				want := m.Lookup(model, q)
				got := clientLookup(t, c, w, model, q)
				if diff := gocmp.Diff(want, got, cmpopts.EquateEmpty(), cmpopts.SortSlices(func(a, b scenario.Match) bool {
					return fmt.Sprint(a.Pod, a.DPRank) < fmt.Sprint(b.Pod, b.DPRank)
				})); diff != "" {
					t.Fatalf("after record %d, Lookup(%s, %d hashes) (-refmodel +indexd):\n%s", i, model, len(q), diff)
				}
			}
		}
	}
}

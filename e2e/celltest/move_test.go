package celltest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/cli/cellscmd"
)

// mover produces records as the bridges do under a cell map: each to
// the topic of its write cell, and, when an endpoint's cell changes, a
// goodbye to the old cell and a resync to the new one first. Every record
// also goes, in the same order, to the reference topic.
type mover struct {
	at map[string]cellmap.Cell
}

func (mv *mover) route(t *testing.T, m *cellmap.Map, recs []refmodel.Record) map[string][]refmodel.Record {
	t.Helper()
	out := map[string][]refmodel.Record{}
	for _, r := range recs {
		c, err := m.WriteCell(r.Headers["model"], r.Key)
		if err != nil {
			t.Fatal(err)
		}
		key := r.Key + "\x00" + r.Headers["dp_rank"]
		if prev, ok := mv.at[key]; ok && prev.Name != c.Name {
			for _, ctl := range []struct {
				kind string
				cell cellmap.Cell
			}{{"goodbye", prev}, {"resync", c}} {
				h := map[string]string{"model": r.Headers["model"], "kind": ctl.kind}
				if v, ok := r.Headers["dp_rank"]; ok {
					h["dp_rank"] = v
				}
				rec := refmodel.Record{Key: r.Key, Headers: h, Time: r.Time}
				out[ctl.cell.Topic] = append(out[ctl.cell.Topic], rec)
				out["reference"] = append(out["reference"], rec)
			}
		}
		if r.Headers["kind"] == "goodbye" {
			delete(mv.at, key)
		} else {
			mv.at[key] = c
		}
		out[c.Topic] = append(out[c.Topic], r)
		out["reference"] = append(out["reference"], r)
	}
	return out
}

// TestMoveAModelUnderTraffic moves model 0 from cell a to cell b with
// `kvindex cells move`'s steps (map both, flip, verify drained, finish)
// while its pods keep producing between the steps: at every step each of
// its endpoints is listed in exactly one cell, the Lookups through the
// map equal a single-cell reference fed the same records, and verify
// reports drained after the flip.
func TestMoveAModelUnderTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("four embedded etcd clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	k, cells := startCells(t, ctx)
	ref := cells["ref"]
	byTopic := map[string]*cell{"cell-a": cells["a"], "cell-b": cells["b"], "cell-c": cells["c"], "reference": ref}
	path := filepath.Join(t.TempDir(), "cells.json")
	if err := os.WriteFile(path, []byte(mapDoc(cells, `"cells": ["c"]`)), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := cellmap.NewWatcher(cellmap.WatcherConfig{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	// Model 0 starts in cell a alone.
	f, err := cellscmd.Move(w.Current().File(), modelName(0), "a", cellscmd.StepBoth)
	if err == nil {
		t.Fatal("model 0 is spread over a and b; moving it within its spread must be refused")
	}
	f = w.Current().File()
	f.Models[0].Cells = []string{"a"}
	apply := func(f cellmap.File) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", cellmap.Format(f), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		if !w.Reload() {
			_, _, lastErr := w.Stats()
			t.Fatalf("map not reloaded: %v", lastErr)
		}
	}
	apply(f)

	recs := refmodel.Generate(refmodel.GenConfig{Seed: 5, Records: 3000, Models: 6, Pods: 24, Start: time.Now()})
	prod := ingesttest.NewProducer(t, k.Brokers)
	mv := &mover{at: map[string]cellmap.Cell{}}
	refClient, err := client.New(ref.indexdAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer refClient.Close()
	cellClient, err := client.New("", client.WithCells(w))
	if err != nil {
		t.Fatal(err)
	}
	defer cellClient.Close()

	// feed produces the next fifth of the stream under the current map
	// and waits until every cell applied it, then checks the invariants.
	next := 0
	feed := func(step string) {
		t.Helper()
		part := recs[next : next+len(recs)/5]
		next += len(part)
		for topic, rs := range mv.route(t, w.Current(), part) {
			offs := ingesttest.Produce(t, ctx, prod, topic, rs)
			ingesttest.WaitApplied(t, ctx, byTopic[topic].cli, ks, topic, offs)
		}
		qs := queries(t, ctx, ref)
		waitFor(t, ctx, step+": Lookups equal the reference, no endpoint doubled", func() (string, bool) {
			rep, err := cellscmd.Verify(ctx, cellClient, w.Current(), modelName(0))
			if err != nil {
				return err.Error(), false
			}
			if len(rep.Doubled) > 0 {
				return fmt.Sprintf("doubled: %v", rep.Doubled), false
			}
			want, err := refClient.ListEndpoints(ctx, modelName(0))
			if err != nil {
				return err.Error(), false
			}
			if len(rep.Endpoints) != len(want.Endpoints) {
				return fmt.Sprintf("%d endpoints of model 0 in the cells, %d in the reference", len(rep.Endpoints), len(want.Endpoints)), false
			}
			for _, q := range qs {
				want, err1 := refClient.Lookup(ctx, q.model, q.hashes)
				got, err2 := cellClient.Lookup(ctx, q.model, q.hashes)
				if err1 != nil || err2 != nil {
					return fmt.Sprintf("%v %v", err1, err2), false
				}
				if d := cmp.Diff(want.Matches, got.Matches); d != "" {
					return fmt.Sprintf("Lookup(%q, %x) (-reference +cells):\n%s", q.model, q.hashes, d), false
				}
			}
			return "", true
		})
	}
	feed("before the move")
	for _, step := range []string{cellscmd.StepBoth, cellscmd.StepFlip} {
		if f, err = cellscmd.Move(w.Current().File(), modelName(0), "b", step); err != nil {
			t.Fatal(err)
		}
		apply(f)
		feed("after step " + step)
	}
	rep, err := cellscmd.Verify(ctx, cellClient, w.Current(), modelName(0))
	if err != nil {
		t.Fatal(err)
	}
	// Every endpoint of model 0 sent a record after the flip only if the
	// stream picked it; the ones it did not pick are still in a.
	moved := 0
	for _, cs := range rep.Endpoints {
		if cs[0] == "b" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no endpoint of model 0 moved to cell b after the flip")
	}
	if !rep.Drained() {
		// The rest of the stream reaches every endpoint (the generator
		// picks endpoints at random), so feed it and check again.
		feed("draining")
		if rep, err = cellscmd.Verify(ctx, cellClient, w.Current(), modelName(0)); err != nil {
			t.Fatal(err)
		}
		if !rep.Drained() {
			t.Fatalf("not drained after the flip: %v doubled, %v misplaced", rep.Doubled, rep.Misplaced)
		}
	}
	if f, err = cellscmd.Move(w.Current().File(), modelName(0), "b", cellscmd.StepFinish); err != nil {
		t.Fatal(err)
	}
	apply(f)
	feed("after step finish")
	if r, _ := w.Current().Route(modelName(0)); len(r.Read) != 1 || r.Read[0] != "b" {
		t.Fatalf("model 0's route after the move = %+v, want cell b only", r)
	}
}

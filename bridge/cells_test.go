package bridge_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/bridge/bridgetest"
	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/testutil"
)

// swapSource is a cell map a test replaces (a Watcher's reload).
type swapSource struct{ m atomic.Pointer[cellmap.Map] }

func (s *swapSource) Current() *cellmap.Map { return s.m.Load() }

func cellMapOf(t *testing.T, cell string) *cellmap.Map {
	t.Helper()
	m, err := cellmap.Parse([]byte(fmt.Sprintf(`{"cells": [{"name": "a", "indexd": "x:1", "topic": "cell-a"}, {"name": "b", "indexd": "x:2", "topic": "cell-b"}],
 "models": [{"match": %q, "cells": [%q]}]}`, model, cell)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCellMapMovesTheEndpoint: records go to the topic of the model's
// cell; when the map moves the model, what was produced is finished in
// the old cell, the endpoint is dropped there (goodbye) and starts fresh
// in the new one (resync), and the stream goes on there with no batch
// lost or doubled.
func TestCellMapMovesTheEndpoint(t *testing.T) {
	e := newEnv(t, nil)
	k := testutil.StartKafka(t, "unused", 1, kfake.SeedTopics(4, "cell-a", "cell-b"))
	src := &swapSource{}
	src.m.Store(cellMapOf(t, "a"))
	cfg := e.config(func(c *bridge.Config) {
		c.Brokers, c.Topic, c.Cells = k.Brokers, "", src
		c.ReplayEndpoint = ""
	})
	r := e.start(cfg, true)
	inA := bridgetest.NewConsumer(t, k.Brokers, "cell-a")
	inB := bridgetest.NewConsumer(t, k.Brokers, "cell-b")

	first := e.publish(3)
	got, err := inA.Read(e.ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	check(t, "cell a before the move", first, got)

	src.m.Store(cellMapOf(t, "b"))
	second := e.publish(2)
	got, err = inB.Read(e.ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	check(t, "cell b after the move", cat([]rec{control(contract.KindResync)}, second), got)
	got, err = inA.Read(e.ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	check(t, "cell a after the move", []rec{control(contract.KindGoodbye)}, got)
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if rest, err := inA.ReadAll(e.ctx); err != nil || len(rest) != 0 {
		t.Fatalf("cell a got more after the move: %s (%v)", describe(rest), err)
	}
	checkMetrics(t, cfg, map[string]float64{"kvindex_bridge_cell_moves_total": 1})
}

// TestCellMapRefusesAnUnmappedModel: a dial-mode bridge whose model has no
// cell does not start.
func TestCellMapRefusesAnUnmappedModel(t *testing.T) {
	m, err := cellmap.Parse([]byte(`{"cells": [{"name": "a", "indexd": "x:1", "topic": "t"}], "models": [{"match": "other", "cells": ["a"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := bridge.DefaultConfig()
	cfg.Endpoint, cfg.Pod, cfg.Model, cfg.Brokers, cfg.Cells = "tcp://127.0.0.1:1", pod, model, []string{"127.0.0.1:1"}, m
	if _, err := bridge.New(cfg); err == nil {
		t.Fatal("New with a model the cell map has no cell for: no error")
	}
}

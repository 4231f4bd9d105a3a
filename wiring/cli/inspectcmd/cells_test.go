package inspectcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// testCell is one real cell for the listing: an embedded etcd holding a
// v2 keyspace written by hand and an indexd serving it.
type testCell struct {
	etcd   *testutil.Etcd
	indexd string
}

// startTestCell writes each endpoint's record and one chunk of gpu blocks
// (gpu[ep] of them), then starts an indexd on that etcd and waits until it
// serves.
func startTestCell(t *testing.T, gpu map[keyspace.Endpoint]int) *testCell {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := testutil.StartEtcd(t)
	ks := keyspace.Default()
	var ops []clientv3.Op
	for ep, n := range gpu {
		rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, Topic: "t",
			LastRecord: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), Partition: int32(ep.Rank)}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(ks.EndpointKey(ep), string(rec)),
			clientv3.OpPut(ks.ChunkKey(ep, tier.GPU, 0), string(keyspace.AppendChunkValue(nil, entries(uint64(len(ops))<<16, n), false))))
	}
	if _, err := e.Client.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	cfg := indexd.DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = e.Client, "127.0.0.1:0"
	srv, err := indexd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	health := srv.Addr()
	if h := srv.HealthAddr(); h != nil {
		health = h
	}
	conn, err := grpc.NewClient(health.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.WaitServing(t, ctx, conn)
	return &testCell{etcd: e, indexd: srv.Addr().String()}
}

// runArgs runs inspect with exactly args.
func runArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(append(args, "--log-level", "error"))
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

type listed struct {
	Cell, Model, Pod string
	Rank             uint32
	GPU              uint64
}

// TestInspectEndpointsCellMap: two real cells (etcd and indexd each), a
// spread model in both and a model in one. inspect endpoints --cell-map
// pages (one endpoint a page) through every cell's indexd and names each
// endpoint's cell; each cell's share equals what inspect reads from that
// cell's etcd directly; --model reads that model's cells only; the
// chunk-level subcommands and etcd flags are refused with --cell-map.
func TestInspectEndpointsCellMap(t *testing.T) {
	const spread, single = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B"
	a := startTestCell(t, map[keyspace.Endpoint]int{
		{Model: spread, Pod: "vllm-0"}: 3, {Model: spread, Pod: "vllm-1", Rank: 1}: 2,
	})
	b := startTestCell(t, map[keyspace.Endpoint]int{
		{Model: spread, Pod: "vllm-2"}: 4, {Model: single, Pod: hostile}: 1,
	})
	path := filepath.Join(t.TempDir(), "cells.json")
	doc := fmt.Sprintf(`{
  "cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}],
  "models": [{"match": %q, "cells": ["a", "b"]}, {"match": "Qwen/*", "cells": ["b"]}],
  "default": "a"
}`, a.indexd, b.indexd, spread)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}

	type cellsJSON struct {
		Cells []struct {
			Cell             string
			Topic            string
			Endpoints, Pages int
			Revision         int64
		}
		Endpoints []struct {
			Cell, Model, Pod string
			Rank             uint32
			HashMode         string `json:"hash_mode"`
			Blocks           map[string]uint64
		}
	}
	list := func(args ...string) cellsJSON {
		t.Helper()
		out, err := runArgs(t, append([]string{"endpoints", "--cell-map", path, "-o", "json", "--page-size", "1"}, args...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var got cellsJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return got
	}
	rows := func(j cellsJSON) []listed {
		var out []listed
		for _, e := range j.Endpoints {
			if e.HashMode != "engine" {
				t.Errorf("%s/%s: hash_mode %q, want engine", e.Model, e.Pod, e.HashMode)
			}
			out = append(out, listed{e.Cell, e.Model, e.Pod, e.Rank, e.Blocks["gpu"]})
		}
		return out
	}

	all := list()
	want := []listed{
		{"a", spread, "vllm-0", 0, 3}, {"a", spread, "vllm-1", 1, 2},
		{"b", single, hostile, 0, 1}, {"b", spread, "vllm-2", 0, 4},
	}
	if d := cmp.Diff(want, rows(all)); d != "" {
		t.Errorf("endpoints across cells (-want +got):\n%s", d)
	}
	if len(all.Cells) != 2 || all.Cells[0].Cell != "a" || all.Cells[1].Cell != "b" {
		t.Fatalf("cells: %+v, want a then b", all.Cells)
	}
	for _, c := range all.Cells {
		// One endpoint a page: at least one page per endpoint, and the
		// cell's revision is its own etcd's (positive).
		if c.Endpoints != 2 || c.Pages < 2 || c.Revision <= 0 {
			t.Errorf("cell %s: %+v, want 2 endpoints in 2 or more pages at a positive revision", c.Cell, c)
		}
	}

	// Each cell's share is what its etcd holds, read directly.
	for name, c := range map[string]*testCell{"a": a, "b": b} {
		out, err := runArgs(t, "endpoints", "--etcd-endpoints", c.etcd.Endpoints[0], "-o", "json")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var direct struct{ Endpoints []struct{ Model, Pod string } }
		if err := json.Unmarshal([]byte(out), &direct); err != nil {
			t.Fatal(err)
		}
		var fromEtcd, fromCells []string
		for _, e := range direct.Endpoints {
			fromEtcd = append(fromEtcd, e.Model+" "+e.Pod)
		}
		for _, e := range all.Endpoints {
			if e.Cell == name {
				fromCells = append(fromCells, e.Model+" "+e.Pod)
			}
		}
		sort.Strings(fromEtcd)
		sort.Strings(fromCells)
		if d := cmp.Diff(fromEtcd, fromCells); d != "" {
			t.Errorf("cell %s: --cell-map listing vs its etcd (-etcd +cells):\n%s", name, d)
		}
	}

	// --model reads the model's cells only; --pod filters the pages.
	q := list("--model", single)
	if len(q.Cells) != 1 || q.Cells[0].Cell != "b" || q.Cells[0].Topic != "tb" {
		t.Errorf("--model %s: cells %+v, want b alone", single, q.Cells)
	}
	if d := cmp.Diff([]listed{{"b", single, hostile, 0, 1}}, rows(q)); d != "" {
		t.Errorf("--model %s (-want +got):\n%s", single, d)
	}
	if d := cmp.Diff([]listed{{"b", spread, "vllm-2", 0, 4}}, rows(list("--model", spread, "--pod", "vllm-2"))); d != "" {
		t.Errorf("--model %s --pod vllm-2 (-want +got):\n%s", spread, d)
	}

	// Text: a CELL column, a footer per cell, the hostile pod quoted.
	out, err := runArgs(t, "endpoints", "--cell-map", path)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, s := range []string{"CELL", "cell a: 2 endpoints at revision", "cell b: 2 endpoints at revision", "4 endpoints in 2 cells", fmt.Sprintf("%q", hostile)} {
		if !strings.Contains(out, s) {
			t.Errorf("text listing lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, hostile) {
		t.Errorf("text listing prints the hostile pod raw:\n%s", out)
	}

	// Refused, as usage errors naming why.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"blocks", "--model", spread, "--pod", "vllm-0", "--cell-map", path}, "endpoints only"},
		{[]string{"chunks", "--cell-map", path}, "endpoints only"},
		{[]string{"models", "--cell-map", path}, "endpoints only"},
		{[]string{"endpoints", "--cell-map", path, "--etcd-endpoints", a.etcd.Endpoints[0]}, "--etcd-endpoints is for one cell"},
		{[]string{"endpoints", "--cell-map", filepath.Join(t.TempDir(), "missing.json")}, "--cell-map"},
	} {
		_, err := runArgs(t, c.args...)
		var ue common.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("inspect %v: %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
}

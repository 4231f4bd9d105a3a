package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/client/cellmap"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// cellIndex is a real gRPC IndexService for one cell: pods maps each pod
// it holds to its matched blocks; ListEndpoints lists them one per page.
// block makes Lookup wait for the caller's deadline.
type cellIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	topic    string
	revision int64
	pods     map[string]uint32
	block    bool
	barrier  atomic.Pointer[kvindexv1.Barrier]
}

func (f *cellIndex) Lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*kvindexv1.LookupResponse, error) {
	if f.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if req.Barrier != nil {
		f.barrier.Store(req.Barrier)
	}
	resp := &kvindexv1.LookupResponse{Revision: f.revision, AppliedOffsets: []*kvindexv1.PartitionOffset{{Topic: f.topic, Offset: f.revision}}}
	for pod, n := range f.pods {
		resp.Matches = append(resp.Matches, &kvindexv1.EndpointMatch{Endpoint: &kvindexv1.Endpoint{Pod: pod}, MatchedBlocks: n, Tiers: make([]kvindexv1.Tier, n)})
	}
	return resp, nil
}

func (f *cellIndex) ListEndpoints(_ context.Context, req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	var pods []string
	for p := range f.pods {
		pods = append(pods, p)
	}
	sortStrings(pods)
	i := 0
	if req.PageToken != "" {
		fmt.Sscanf(req.PageToken, "%d", &i)
	}
	resp := &kvindexv1.ListEndpointsResponse{Revision: f.revision}
	if i < len(pods) {
		resp.Endpoints = []*kvindexv1.EndpointInfo{{Model: req.Model, Endpoint: &kvindexv1.Endpoint{Pod: pods[i]}}}
	}
	if i+1 < len(pods) {
		resp.NextPageToken = fmt.Sprint(i + 1)
	}
	return resp, nil
}

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

// threeCells serves cells a, b, c and a map where "big" is spread over a
// and b, "solo" lives in c.
func threeCells(t *testing.T, a, b, c *cellIndex) *cellmap.Map {
	t.Helper()
	addrA, _ := serve(t, a)
	addrB, _ := serve(t, b)
	addrC, _ := serve(t, c)
	m, err := cellmap.Parse([]byte(fmt.Sprintf(`{
  "cells": [
    {"name": "a", "indexd": %q, "topic": "ta"},
    {"name": "b", "indexd": %q, "topic": "tb"},
    {"name": "c", "indexd": %q, "topic": "tc"}
  ],
  "models": [{"match": "big", "cells": ["a", "b"]}, {"match": "solo", "cells": ["c"]}]
}`, addrA, addrB, addrC)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCellsLookupMerges(t *testing.T) {
	a := &cellIndex{topic: "ta", revision: 7, pods: map[string]uint32{"p1": 3, "p2": 1}}
	b := &cellIndex{topic: "tb", revision: 900, pods: map[string]uint32{"p3": 2}}
	c := &cellIndex{topic: "tc", revision: 5, pods: map[string]uint32{"p9": 4}}
	cl := newClient(t, "", WithCells(threeCells(t, a, b, c)))
	ctx := context.Background()

	got, err := cl.Lookup(ctx, "big", []uint64{1, 2, 3}, WithBarrier(time.Second, PartitionOffset{Topic: "tb", Offset: 1}, PartitionOffset{Topic: "tc", Offset: 1}))
	if err != nil {
		t.Fatal(err)
	}
	want := &LookupResult{
		Matches: []Match{
			{Endpoint: Endpoint{Pod: "p1"}, Blocks: 3, Tiers: make([]Tier, 3)},
			{Endpoint: Endpoint{Pod: "p3"}, Blocks: 2, Tiers: make([]Tier, 2)},
			{Endpoint: Endpoint{Pod: "p2"}, Blocks: 1, Tiers: make([]Tier, 1)},
		},
		AppliedOffsets: []PartitionOffset{{Topic: "ta", Offset: 7}, {Topic: "tb", Offset: 900}},
		Cells: []CellAnswer{
			{Cell: "a", Revision: 7, AppliedOffsets: []PartitionOffset{{Topic: "ta", Offset: 7}}},
			{Cell: "b", Revision: 900, AppliedOffsets: []PartitionOffset{{Topic: "tb", Offset: 900}}},
		},
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("spread Lookup (-want +got):\n%s", diff)
	}
	if a.barrier.Load() != nil {
		t.Error("cell a got a barrier naming only other cells' topics")
	}
	if bb := b.barrier.Load(); len(bb.GetRecords()) != 1 || bb.Records[0].Topic != "tb" {
		t.Errorf("cell b's barrier = %v, want its own topic's record only", bb)
	}

	got, err = cl.Lookup(ctx, "solo", []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != 5 || len(got.Cells) != 1 || got.Cells[0].Cell != "c" || len(got.Matches) != 1 || got.Matches[0].Endpoint.Pod != "p9" {
		t.Fatalf("single-cell Lookup = %+v, want cell c's answer at its revision", got)
	}

	if _, err := cl.Lookup(ctx, "unmapped", []uint64{1}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Lookup of a model the map has no cell for: %v, want ErrInvalidArgument", err)
	}
}

func TestCellsLookupPartial(t *testing.T) {
	a := &cellIndex{topic: "ta", revision: 7, pods: map[string]uint32{"p1": 3}}
	b := &cellIndex{topic: "tb", block: true}
	c := &cellIndex{topic: "tc", block: true}
	cl := newClient(t, "", WithCells(threeCells(t, a, b, c)), WithTimeout(200*time.Millisecond))
	got, err := cl.Lookup(context.Background(), "big", []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Partial() || len(got.Failed) != 1 || got.Failed[0].Cell != "b" || !errors.Is(got.Failed[0].Err, ErrDeadlineExceeded) {
		t.Fatalf("Failed = %+v, want cell b with ErrDeadlineExceeded", got.Failed)
	}
	if len(got.Matches) != 1 || got.Matches[0].Endpoint.Pod != "p1" || got.Revision != 7 {
		t.Fatalf("partial answer = %+v, want cell a's p1 at revision 7", got)
	}
	// A model whose only cell does not answer fails as a one-target call.
	if _, err := cl.Lookup(context.Background(), "solo", []uint64{1}); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("Lookup of a model in an unanswering cell: %v, want ErrDeadlineExceeded", err)
	}
}

func TestCellsLookupDuplicateKeepsWriteCell(t *testing.T) {
	// While a model moves, one endpoint may be in two cells: the copy of
	// the cell the map writes the pod to wins.
	a := &cellIndex{topic: "ta", pods: map[string]uint32{"p": 1}}
	b := &cellIndex{topic: "tb", pods: map[string]uint32{"p": 2}}
	addrA, _ := serve(t, a)
	addrB, _ := serve(t, b)
	for _, write := range []string{"a", "b"} {
		read := map[string]string{"a": "b", "b": "a"}[write]
		m, err := cellmap.Parse([]byte(fmt.Sprintf(`{"cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}],
 "models": [{"match": "m", "cells": [%q], "readAlso": [%q]}]}`, addrA, addrB, write, read)))
		if err != nil {
			t.Fatal(err)
		}
		cl := newClient(t, "", WithCells(m))
		got, err := cl.Lookup(context.Background(), "m", []uint64{1, 2})
		if err != nil {
			t.Fatal(err)
		}
		wantBlocks := map[string]int{"a": 1, "b": 2}[write]
		if len(got.Matches) != 1 || got.Matches[0].Blocks != wantBlocks || got.Duplicates != 1 {
			t.Fatalf("write cell %s: %+v, want one match of %d blocks and 1 duplicate", write, got, wantBlocks)
		}
	}
}

func TestCellsListEndpointsPagesAcrossCells(t *testing.T) {
	a := &cellIndex{topic: "ta", pods: map[string]uint32{"p1": 1, "p4": 1}}
	b := &cellIndex{topic: "tb", pods: map[string]uint32{"p2": 1}}
	c := &cellIndex{topic: "tc", pods: map[string]uint32{"p3": 1}}
	cl := newClient(t, "", WithCells(threeCells(t, a, b, c)))
	ctx := context.Background()

	l, err := cl.ListEndpoints(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Pod, Cell string }
	var got []row
	for _, e := range l.Endpoints {
		got = append(got, row{e.Endpoint.Pod, e.Cell})
	}
	want := []row{{"p1", "a"}, {"p2", "b"}, {"p4", "a"}}
	if diff := gocmp.Diff(want, got); diff != "" || l.Pages != 3 {
		t.Fatalf("ListEndpoints(big) (-want +got):\n%s pages %d, want 3", diff, l.Pages)
	}

	// One page at a time across every cell.
	var pods []string
	token, pages := "", 0
	for {
		p, err := cl.ListEndpointsPage(ctx, "", 0, token)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, e := range p.Endpoints {
			pods = append(pods, e.Cell+"/"+e.Endpoint.Pod)
		}
		if p.NextPageToken == "" {
			break
		}
		token = p.NextPageToken
	}
	if diff := gocmp.Diff([]string{"a/p1", "a/p4", "b/p2", "c/p3"}, pods, cmpopts.EquateEmpty()); diff != "" || pages != 4 {
		t.Fatalf("ListEndpointsPage walk (-want +got):\n%s pages %d, want 4", diff, pages)
	}
	if _, err := cl.ListEndpointsPage(ctx, "", 0, "7"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a token the map did not issue: %v, want ErrInvalidArgument", err)
	}
}

func TestCellsNew(t *testing.T) {
	m, err := cellmap.Parse([]byte(`{"cells": [{"name": "a", "indexd": "127.0.0.1:1", "topic": "t"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New("127.0.0.1:1", WithCells(m)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("New with a target and a cell map: %v, want ErrInvalidArgument", err)
	}
	if _, err := New("", WithCells(nil)); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "nil cell source") {
		t.Fatalf("New with WithCells(nil): %v, want ErrInvalidArgument naming the nil cell source", err)
	}
	c, err := New("", WithCells(m))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.Lookup(context.Background(), "x", []uint64{1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lookup after Close: %v, want ErrClosed", err)
	}
}

// TestCellsRefusedTargetIsInvalid: a cell whose indexd target New refuses
// (here: hosts that differ, with TLS on and no server name) fails calls
// as the configuration error it is, ErrInvalidArgument naming the cell,
// not as an outage, and New is not tried again on every call. Before, the
// call came back ErrUnavailable ("no cell answered"), with New, and its
// read of the TLS files, repeated per call.
func TestCellsRefusedTargetIsInvalid(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir+"/ca", "indexd", 0)
	m, err := cellmap.Parse([]byte(`{"cells": [{"name": "a", "indexd": "10.0.0.1:50051,10.0.0.2:50051", "topic": "ta"}],
  "models": [{"match": "m", "cells": ["a"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cl := newClient(t, "", WithCells(m), WithTLSCAFile(dir+"/ca.pem"), WithTimeout(time.Second))
	_, err = cl.Lookup(context.Background(), "m", []uint64{1})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "connecting to cell a") || !strings.Contains(err.Error(), "lists different hosts") {
		t.Fatalf("Lookup through a refused cell target: %v, want ErrInvalidArgument naming cell a and the reason", err)
	}
	// The refusal is kept for cellRetryAfter: with the CA file gone, the
	// next call still says why the target was refused, not that the file
	// is missing.
	if err := os.Remove(dir + "/ca.pem"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Lookup(context.Background(), "m", []uint64{1}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "lists different hosts") {
		t.Fatalf("second Lookup: %v, want the kept refusal", err)
	}
}

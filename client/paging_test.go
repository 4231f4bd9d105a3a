package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// pagedIndex is a real gRPC IndexService whose ListEndpoints serves
// fixed pages: page i answers token "" (i = 0) or the token "p<i>", at
// revision 10+i, and names the next page's token (none after the last);
// repeat makes every page name its own token instead.
type pagedIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	pages  [][]string // pod names
	repeat bool
	calls  atomic.Int32
}

func (p *pagedIndex) ListEndpoints(_ context.Context, req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	p.calls.Add(1)
	i := 0
	if req.PageToken != "" {
		if _, err := fmt.Sscanf(req.PageToken, "p%d", &i); err != nil || i <= 0 || i >= len(p.pages) {
			return nil, status.Errorf(codes.InvalidArgument, "bad token %q", req.PageToken)
		}
	}
	resp := &kvindexv1.ListEndpointsResponse{Revision: int64(10 + i)}
	for _, pod := range p.pages[i] {
		resp.Endpoints = append(resp.Endpoints, &kvindexv1.EndpointInfo{Model: "m", Endpoint: &kvindexv1.Endpoint{Pod: pod}})
	}
	switch {
	case p.repeat:
		resp.NextPageToken = req.PageToken
		if i == 0 {
			resp.NextPageToken = "p1"
		}
	case i+1 < len(p.pages):
		resp.NextPageToken = fmt.Sprintf("p%d", i+1)
	}
	return resp, nil
}

func TestListEndpointsRevisionsAcrossPages(t *testing.T) {
	f := &pagedIndex{pages: [][]string{{"a", "b"}, {}, {"c"}}}
	addr, _ := serve(t, f)
	c := newClient(t, addr)
	list, err := c.ListEndpoints(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, e := range list.Endpoints {
		pods = append(pods, e.Endpoint.Pod)
	}
	// An empty page that names a next token does not end the list.
	if diff := gocmp.Diff([]string{"a", "b", "c"}, pods); diff != "" {
		t.Fatalf("pods (-want +got):\n%s", diff)
	}
	if list.Pages != 3 || list.Revision != 10 || list.MaxRevision != 12 {
		t.Fatalf("pages %d revisions %d..%d, want 3 pages at 10..12", list.Pages, list.Revision, list.MaxRevision)
	}

	loop := &pagedIndex{pages: [][]string{{"a"}, {"b"}, {"c"}}, repeat: true}
	addr, _ = serve(t, loop)
	c = newClient(t, addr)
	if _, err := c.ListEndpoints(context.Background(), "m"); !errors.Is(err, ErrInternal) || loop.calls.Load() != 2 {
		t.Fatalf("a server repeating its token: %v after %d calls, want ErrInternal after 2", err, loop.calls.Load())
	}
}

// cyclingIndex hands out page tokens "a", "b", "a", "b", ... for ever (a
// buggy server, or replicas of different versions).
type cyclingIndex struct {
	kvindexv1.UnimplementedIndexServiceServer
	calls atomic.Int64
}

func (c *cyclingIndex) ListEndpoints(_ context.Context, req *kvindexv1.ListEndpointsRequest) (*kvindexv1.ListEndpointsResponse, error) {
	c.calls.Add(1)
	next := "a"
	if req.PageToken == "a" {
		next = "b"
	}
	return &kvindexv1.ListEndpointsResponse{Revision: 1, NextPageToken: next,
		Endpoints: []*kvindexv1.EndpointInfo{{Model: "m", Endpoint: &kvindexv1.Endpoint{Pod: "p" + next}}}}, nil
}

// TestListEndpointsStopsAtARepeatedToken: a server whose page tokens come
// round again fails the walk with ErrInternal at the first repeat. Before,
// only a token repeated twice in a row was refused, and a cycle of two was
// followed until the caller's deadline (for ever under
// context.Background), its endpoints piling up.
func TestListEndpointsStopsAtARepeatedToken(t *testing.T) {
	f := &cyclingIndex{}
	addr, _ := serve(t, f)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.ListEndpoints(ctx, "")
	if !errors.Is(err, ErrInternal) || !strings.Contains(err.Error(), `page token "a" a second time`) || l != nil {
		t.Fatalf("ListEndpoints = %v, %v; want ErrInternal naming the repeated token", l, err)
	}
	if n := f.calls.Load(); n != 3 {
		t.Fatalf("%d pages asked for, want 3 (tokens \"\", a, b; then a again)", n)
	}
}

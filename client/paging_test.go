package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// startIndexd runs a real indexd replica on etcd until the test ends and
// returns its address once it serves (its first list, which reflects
// every write made before the call).
func startIndexd(t *testing.T, cli *clientv3.Client) string {
	t.Helper()
	cfg := indexd.DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = cli, "127.0.0.1:0"
	srv, err := indexd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for indexd to serve: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			return srv.Addr().String()
		}
	}
}

// TestListEndpointsManyLongNames is the attack on ListEndpoints: 20,000
// endpoints with 480-byte pod names, about 10 MB of endpoints, more than
// twice gRPC's default 4 MiB receive limit. The client walks the pages
// and gets every endpoint, in order.
func TestListEndpointsManyLongNames(t *testing.T) {
	const n, podLen = 20000, 480
	e := testutil.StartEtcd(t)
	ks := keyspace.Default()
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, Partition: 3}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		want     []EndpointInfo
		rev      int64
		encoded  int
		ops      []clientv3.Op
		modelFor = func(i int) string { return fmt.Sprintf("model-%d", i%3) }
	)
	for i := range n {
		pod := fmt.Sprintf("pod-%06d-", i)
		pod += strings.Repeat("x", podLen-len(pod))
		ep := keyspace.Endpoint{Model: modelFor(i), Pod: pod}
		want = append(want, EndpointInfo{Model: ep.Model, Endpoint: Endpoint{Pod: pod}, BlockSize: 16, Partition: 3})
		encoded += proto.Size(&kvindexv1.EndpointInfo{Model: ep.Model, Endpoint: &kvindexv1.Endpoint{Pod: pod}, BlockSize: 16, Partition: 3})
		ops = append(ops, clientv3.OpPut(ks.EndpointKey(ep), string(rec)))
		if len(ops) == 128 || i == n-1 {
			resp, err := e.Client.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				t.Fatal(err)
			}
			rev, ops = resp.Header.Revision, nil
		}
	}
	if encoded <= 4<<20 {
		t.Fatalf("the endpoints encode to %d bytes: the test no longer exceeds 4 MiB", encoded)
	}
	slices.SortFunc(want, func(a, b EndpointInfo) int {
		return strings.Compare(a.Model+"\x00"+a.Endpoint.Pod, b.Model+"\x00"+b.Endpoint.Pod)
	})
	c := newClient(t, startIndexd(t, e.Client))

	list, err := c.ListEndpoints(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff(want, list.Endpoints); diff != "" {
		t.Fatalf("endpoints (-want +got):\n%s", diff)
	}
	if wantPages := n / indexd.DefaultListPageSize; list.Pages != wantPages || list.Revision != rev || list.MaxRevision != rev {
		t.Fatalf("pages %d (want %d), revisions %d..%d (want %d)", list.Pages, wantPages, list.Revision, list.MaxRevision, rev)
	}

	// One model, by hand with a page size of our own.
	var got []EndpointInfo
	token := ""
	for {
		page, err := c.ListEndpointsPage(ctx, "model-1", 3000, token)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Endpoints) > indexd.DefaultMaxListPageSize {
			t.Fatalf("a page of %d endpoints, over the server's maximum %d", len(page.Endpoints), indexd.DefaultMaxListPageSize)
		}
		got = append(got, page.Endpoints...)
		if token = page.NextPageToken; token == "" {
			break
		}
	}
	wantModel1 := slices.DeleteFunc(slices.Clone(want), func(e EndpointInfo) bool { return e.Model != "model-1" })
	if diff := gocmp.Diff(wantModel1, got); diff != "" {
		t.Fatalf("model-1 endpoints (-want +got):\n%s", diff)
	}
}

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

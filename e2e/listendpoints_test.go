package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// The client's paging against a real indexd (moved from the client
// module, whose tests import nothing of the main module).

// servingIndexd runs a real indexd replica on etcd until the test ends and
// returns its address once it serves (its first list, which reflects
// every write made before the call).
func servingIndexd(t *testing.T, cli *clientv3.Client) string {
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
	// The first list reads every endpoint written before the call; 12,000
	// of them (6 MB) under the race detector on a shared 2-core machine
	// can take minutes.
	wctx, wcancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
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

// TestListEndpointsManyLongNames is the attack on ListEndpoints: 12,000
// endpoints with 480-byte pod names, about 6 MB of endpoints, well over
// gRPC's default 4 MiB receive limit (the test checks that it is). The client walks the pages
// and gets every endpoint, in order.
func TestListEndpointsManyLongNames(t *testing.T) {
	t.Parallel()
	const n, podLen = 12000, 480
	e := testutil.StartEtcd(t)
	ks := keyspace.Default()
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, Partition: 3}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(3*time.Minute))
	defer cancel()
	var (
		want     []client.EndpointInfo
		rev      int64
		encoded  int
		ops      []clientv3.Op
		modelFor = func(i int) string { return fmt.Sprintf("model-%d", i%3) }
	)
	for i := range n {
		pod := fmt.Sprintf("pod-%06d-", i)
		pod += strings.Repeat("x", podLen-len(pod))
		ep := keyspace.Endpoint{Model: modelFor(i), Pod: pod}
		want = append(want, client.EndpointInfo{Model: ep.Model, Endpoint: client.Endpoint{Pod: pod}, BlockSize: 16, Partition: 3, HashMode: client.HashModeEngine})
		encoded += proto.Size(&kvindexv1.EndpointInfo{Model: ep.Model, Endpoint: &kvindexv1.Endpoint{Pod: pod}, BlockSize: 16, Partition: 3, HashMode: kvindexv1.HashMode_HASH_MODE_ENGINE})
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
	slices.SortFunc(want, func(a, b client.EndpointInfo) int {
		return strings.Compare(a.Model+"\x00"+a.Endpoint.Pod, b.Model+"\x00"+b.Endpoint.Pod)
	})
	c := newClient(t, servingIndexd(t, e.Client))

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
	var got []client.EndpointInfo
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
	wantModel1 := slices.DeleteFunc(slices.Clone(want), func(e client.EndpointInfo) bool { return e.Model != "model-1" })
	if diff := gocmp.Diff(wantModel1, got); diff != "" {
		t.Fatalf("model-1 endpoints (-want +got):\n%s", diff)
	}
}

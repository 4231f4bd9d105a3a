package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// The router client against real indexd replicas, one of which falls
// behind or goes silent (the client module's tests use stand-in servers).

const replicasModel = "replicas/model"

// putEndpoint writes an engine-mode endpoint of pod holding hashes on GPU,
// as one chunk, on a lease of its own.
func putEndpoint(t *testing.T, cli *clientv3.Client, pod string, hashes ...uint64) {
	t.Helper()
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	ks, ep := keyspace.Default(), keyspace.Endpoint{Model: replicasModel, Pod: pod}
	rec := fmt.Sprintf(`{"hash_mode":"engine","block_size":16,"last_record":"2026-12-01T12:00:00Z","topic":"t","partition":0,"lease":%q,"tier_leases":{"gpu":[{"id":%q,"keys":1}]},"chunk_next":{"gpu":1}}`,
		keyspace.LeaseID(lease.ID), keyspace.LeaseID(lease.ID))
	es := make([]keyspace.ChunkEntry, len(hashes))
	for i, h := range hashes {
		es[i] = keyspace.ChunkEntry{Key: h}
	}
	if _, err := cli.Txn(ctx).Then(
		clientv3.OpPut(ks.EndpointKey(ep), rec, clientv3.WithLease(lease.ID)),
		clientv3.OpPut(ks.ChunkKey(ep, tier.GPU, 0), string(keyspace.AppendChunkValue(nil, es, false)), clientv3.WithLease(lease.ID)),
	).Commit(); err != nil {
		t.Fatal(err)
	}
}

// warm sends Lookups until every replica's connection has answered (n
// calls round-robin over them).
func warm(t *testing.T, c *client.Client, n int) {
	t.Helper()
	for range n {
		if _, err := c.Lookup(context.Background(), replicasModel, []uint64{1, 2, 3}); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}
}

// TestClientAvoidsReplicaBehind: two replicas, one cut off from etcd (it
// keeps answering from memory, its progress time stops), then pod-a's
// blocks leave the index. Once that replica is past WithStaleAfter, no
// answer to 8 concurrent callers names pod-a. Before, the stale search
// went through the round robin everybody shared and paused for every
// caller after one unlucky search: about half of the answers came from
// the replica behind, ghosts of removed blocks.
func TestClientAvoidsReplicaBehind(t *testing.T) {
	e := testutil.StartEtcd(t)
	putEndpoint(t, e.Client, "pod-a", 1, 2, 3)
	putEndpoint(t, e.Client, "pod-b", 1)
	live := servingIndexd(t, e.Client)
	px := testutil.StartProxy(t, testutil.HostPort(e.Endpoints[0]))
	cut, err := testutil.NewEtcdClient([]string{px.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut.Close() })
	behind := servingIndexd(t, cut)
	c, err := client.New(live+","+behind, client.WithTimeout(testutil.Timeout(2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	warm(t, c, 20)
	px.Hang()
	if _, err := e.Client.Delete(context.Background(), keyspace.Default().ChunkKey(keyspace.Endpoint{Model: replicasModel, Pod: "pod-a"}, tier.GPU, 0)); err != nil {
		t.Fatal(err)
	}
	// Past WithStaleAfter from the cut replica's last progress (indexd
	// asks for one every second).
	time.Sleep(client.DefaultStaleAfter + 1500*time.Millisecond)
	var ghosts, calls atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(2 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				res, err := c.Lookup(context.Background(), replicasModel, []uint64{1, 2, 3})
				if err != nil {
					t.Errorf("Lookup: %v", err)
					return
				}
				calls.Add(1)
				for _, m := range res.Matches {
					if m.Endpoint.Pod == "pod-a" {
						ghosts.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if calls.Load() == 0 || ghosts.Load() > 0 {
		t.Fatalf("%d of %d answers named pod-a, whose blocks were removed, from the replica behind; a current replica answered throughout", ghosts.Load(), calls.Load())
	}
}

// TestClientAvoidsSilentReplica: three replicas, one of which stops
// answering with its connection held open (a stopped process, a node gone
// dark). One call runs out the client's deadline on it; after that the
// client avoids it and the calls go to the two live replicas. Before,
// every third call waited out its deadline for as long as the connection
// stayed up.
func TestClientAvoidsSilentReplica(t *testing.T) {
	e := testutil.StartEtcd(t)
	putEndpoint(t, e.Client, "pod-a", 1, 2, 3)
	a1, a2 := servingIndexd(t, e.Client), servingIndexd(t, e.Client)
	px := testutil.StartProxy(t, servingIndexd(t, e.Client))
	c, err := client.New(a1+","+a2+","+px.Addr(), client.WithTimeout(testutil.Timeout(300*time.Millisecond)), client.WithStaleAfter(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	warm(t, c, 30)
	px.Hang()
	failed := 0
	for range 60 {
		if _, err := c.Lookup(context.Background(), replicasModel, []uint64{1, 2, 3}); err != nil {
			if !errors.Is(err, client.ErrDeadlineExceeded) {
				t.Fatalf("Lookup: %v, want an answer or ErrDeadlineExceeded", err)
			}
			failed++
		}
	}
	if failed > 1 {
		t.Fatalf("%d of 60 Lookups ran out their deadline after one replica of three went silent, want at most 1", failed)
	}
}

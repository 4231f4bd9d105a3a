package indexd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/internal/index"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

const model = "meta-llama/Llama-3.1-8B-Instruct"

var (
	pod0 = keyspace.Endpoint{Model: model, Pod: "vllm-0"}
	pod1 = keyspace.Endpoint{Model: model, Pod: "team-a/vllm 1@10.0.0.5:8000"}
	pod2 = keyspace.Endpoint{Model: model, Pod: "vllm-2", Rank: 1}
)

func blk(ep keyspace.Endpoint, t tier.Tier, h uint64) keyspace.Block {
	return keyspace.Block{Endpoint: ep, Tier: t, Hash: h}
}

func TestLookupSemantics(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	other := keyspace.Endpoint{Model: "m2", Pod: "vllm-0"}
	w.commit(
		w.put(blk(pod0, tier.GPU, 1)), w.put(blk(pod0, tier.GPU, 2)), w.put(blk(pod0, tier.CPU, 3)),
		w.put(blk(pod1, tier.Disk, 1)), w.put(blk(pod1, tier.CPU, 1)), w.put(blk(pod1, tier.GPU, 2)),
		w.put(blk(pod2, tier.GPU, 1)), w.put(blk(pod2, tier.GPU, 2)), w.put(blk(pod2, tier.GPU, 3)), w.put(blk(pod2, tier.GPU, 4)),
		w.put(blk(other, tier.GPU, 1)), w.put(blk(other, tier.GPU, 2)),
	)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	tiers := func(ts ...tier.Tier) []tier.Tier { return ts }
	for _, tc := range []struct {
		name   string
		model  string
		hashes []uint64
		cands  []keyspace.Endpoint
		want   []index.Match
	}{
		{
			name: "longest_leading_run_and_best_tier", model: model, hashes: []uint64{1, 2, 3, 4},
			want: []index.Match{
				{Endpoint: pod2, Blocks: 4, Tiers: tiers(tier.GPU, tier.GPU, tier.GPU, tier.GPU)},
				{Endpoint: pod0, Blocks: 3, Tiers: tiers(tier.GPU, tier.GPU, tier.CPU)},
				{Endpoint: pod1, Blocks: 2, Tiers: tiers(tier.CPU, tier.GPU)},
			},
		},
		{name: "gap_ends_the_run", model: model, hashes: []uint64{9, 1, 2}, want: nil},
		{
			name: "candidates_filter", model: model, hashes: []uint64{1, 2, 3},
			cands: []keyspace.Endpoint{{Pod: pod1.Pod}, {Pod: "unknown"}, {Pod: pod2.Pod, Rank: 0}},
			want:  []index.Match{{Endpoint: pod1, Blocks: 2, Tiers: tiers(tier.CPU, tier.GPU)}},
		},
		{
			name: "models_are_separate", model: "m2", hashes: []uint64{1, 2, 3},
			want: []index.Match{{Endpoint: other, Blocks: 2, Tiers: tiers(tier.GPU, tier.GPU)}},
		},
		{name: "unknown_model", model: "nope", hashes: []uint64{1}, want: nil},
		{name: "no_hashes", model: model, hashes: nil, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, resp := lookup(t, r, w, tc.model, tc.hashes, tc.cands)
			if diff := gocmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
			wantOffsets := []*kvindexv1.PartitionOffset{{Topic: w.part.Topic, Partition: w.part.Partition, Offset: w.next}}
			if diff := gocmp.Diff(wantOffsets, resp.AppliedOffsets, protocmp.Transform()); diff != "" {
				t.Fatalf("applied offsets (-want +got):\n%s", diff)
			}
			if resp.Revision == 0 {
				t.Fatal("response names no revision")
			}
		})
	}
}

func TestBarrier(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	w.commit(w.put(blk(pod0, tier.GPU, 1))) // record offset 0, next offset 1
	r := startReplica(t, e.Client, func(c *Config) { c.BarrierTimeout = 200 * time.Millisecond })
	r.waitServing(t)
	call := func(ctx context.Context, b *kvindexv1.Barrier) (*kvindexv1.LookupResponse, error) {
		return r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1, 2}, Barrier: b})
	}
	rec := func(topic string, part int32, off int64) *kvindexv1.PartitionOffset {
		return &kvindexv1.PartitionOffset{Topic: topic, Partition: part, Offset: off}
	}

	t.Run("waits_for_the_record", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		type result struct {
			resp *kvindexv1.LookupResponse
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := call(ctx, &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec(w.part.Topic, 0, 1)}, Timeout: durationpb.New(testTimeout)})
			done <- result{resp, err}
		}()
		_, rev := w.commit(w.put(blk(pod0, tier.GPU, 2))) // record offset 1
		res := <-done
		if res.err != nil {
			t.Fatal(res.err)
		}
		if res.resp.Revision < rev || len(res.resp.Matches) != 1 || res.resp.Matches[0].MatchedBlocks != 2 {
			t.Fatalf("answer at revision %d (want >= %d) does not reflect the record: %v", res.resp.Revision, rev, res.resp)
		}
	})
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		barrier  *kvindexv1.Barrier
		wantMsg  []string
	}{
		{
			name:    "timeout_names_the_lagging_partition",
			barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec(w.part.Topic, 0, 0), rec(w.part.Topic, 0, 7)}},
			wantMsg: []string{"partition kvindex-events/0", "record offset 7 is not applied yet", "applied records up to offset 1"},
		},
		{
			name:    "unknown_partition",
			barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec(w.part.Topic, 0, 0), rec("other", 3, 0)}, Timeout: durationpb.New(50 * time.Millisecond)},
			wantMsg: []string{"partition other/3: record offset 0 is not applied yet", "no record of the partition"},
		},
		{
			name:     "call_deadline_bounds_the_wait",
			deadline: 100 * time.Millisecond,
			barrier:  &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec(w.part.Topic, 0, 9)}, Timeout: durationpb.New(testTimeout)},
			wantMsg:  []string{"partition kvindex-events/0", "record offset 9"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			if tc.deadline > 0 {
				cancel()
				ctx, cancel = context.WithTimeout(context.Background(), tc.deadline)
			}
			defer cancel()
			_, err := call(ctx, tc.barrier)
			st := status.Convert(err)
			if st.Code() != codes.DeadlineExceeded {
				t.Fatalf("code = %v (%v), want DEADLINE_EXCEEDED", st.Code(), err)
			}
			// A client-side deadline may fire before the server's answer
			// arrives; the server's own message is checked when it does.
			if tc.deadline > 0 && !strings.Contains(st.Message(), "barrier") {
				return
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(st.Message(), m) {
					t.Errorf("message %q does not contain %q", st.Message(), m)
				}
			}
		})
	}
}

func TestRequestLimits(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) {
		c.MaxHashes = 4
		c.MaxCandidates = 100000
		c.MaxBarrierRecords = 2
		c.MaxRequestBytes = 2048
		c.MaxBarrierTimeout = 10 * time.Second
	})
	r.waitServing(t)
	many := func(n int) []*kvindexv1.Endpoint {
		out := make([]*kvindexv1.Endpoint, n)
		for i := range out {
			out[i] = &kvindexv1.Endpoint{Pod: "a-rather-long-pod-name-to-fill-the-request"}
		}
		return out
	}
	rec := &kvindexv1.PartitionOffset{Topic: "t"}
	for _, tc := range []struct {
		name    string
		req     *kvindexv1.LookupRequest
		wantMsg string
	}{
		{name: "missing_model", req: &kvindexv1.LookupRequest{}, wantMsg: "model is required"},
		{name: "too_many_hashes", req: &kvindexv1.LookupRequest{Model: model, BlockHashes: make([]uint64, 5)}, wantMsg: "5 hashes, the limit is 4"},
		{name: "request_too_big", req: &kvindexv1.LookupRequest{Model: model, Candidates: many(50)}, wantMsg: "the limit is 2048 bytes"},
		{name: "empty_candidate_pod", req: &kvindexv1.LookupRequest{Model: model, Candidates: []*kvindexv1.Endpoint{{}}}, wantMsg: "candidates[0]"},
		{name: "too_many_barrier_records", req: &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec, rec, rec}}}, wantMsg: "3 records, the limit is 2"},
		{name: "negative_barrier_offset", req: &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{{Topic: "t", Offset: -1}}}}, wantMsg: "must not be negative"},
		{name: "barrier_without_topic", req: &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{{}}}}, wantMsg: "empty topic"},
		{name: "barrier_timeout_over_limit", req: &kvindexv1.LookupRequest{Model: model, Barrier: &kvindexv1.Barrier{Records: []*kvindexv1.PartitionOffset{rec}, Timeout: durationpb.New(time.Hour)}}, wantMsg: "exceeds the limit of 10s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_, err := r.api.Lookup(ctx, tc.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("error = %v, want INVALID_ARGUMENT containing %q", err, tc.wantMsg)
			}
		})
	}
	if n := r.counter(t, r.srv.m.requests.WithLabelValues("Lookup", codes.InvalidArgument.String())); n != 8 {
		t.Fatalf("requests_total{Lookup,InvalidArgument} = %v, want 8", n)
	}
}

func TestNotServingBeforeFirstList(t *testing.T) {
	// etcd is not there yet: the replica dials a proxy that refuses every
	// connection until etcd starts.
	px := testutil.StartProxy(t, "127.0.0.1:1")
	px.Cut()
	r := startReplica(t, ownClient(t, []string{px.Endpoint()}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	h, err := r.health.Check(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
	if err != nil || h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the first list = %v, %v; want NOT_SERVING", h, err)
	}
	if r.srv.Ready() == nil {
		t.Fatal("Ready() = nil before the first list")
	}
	_, err = r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Lookup before the first list: %v, want UNAVAILABLE", err)
	}
	_, err = r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("ListEndpoints before the first list: %v, want UNAVAILABLE", err)
	}
	// etcd appears: the list succeeds and the replica serves.
	e := testutil.StartEtcd(t)
	px.Restore(e.Endpoints[0])
	r.waitServing(t)
	if err := r.srv.Ready(); err != nil {
		t.Fatalf("Ready() = %v after SERVING", err)
	}
	r.stop()
}

func TestMalformedKeysCounted(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	ks := keyspace.Default()
	junk := func(k string) clientv3.Op { return clientv3.OpPut(k, "") }
	junkValue := func(k, v string) clientv3.Op { return clientv3.OpPut(k, v) }
	// Before the list: junk in the chunks/ section, under a known endpoint
	// and not; a chunk value that does not parse.
	w.commit(w.record(pod0, keyspace.EndpointRecord{}), w.put(blk(pod0, tier.GPU, 1)),
		junk(ks.EndpointChunksPrefix(pod0)+"gpu/not-a-seq"), junk(ks.Prefix()+"chunks/x"),
		junkValue(ks.ChunkKey(pod0, tier.CPU, 7), "\x07ragged"))
	r := startReplica(t, e.Client)
	r.waitServing(t)
	// Through the watch: junk in several sections, a v1 block key, a bad
	// record and a bad chunk value.
	w.commit(junk(ks.Prefix()+"nosection/1"), junk(ks.EndpointChunksPrefix(pod1)+"hbm/0000000000000001"),
		junk(ks.Prefix()+"blocks/m/p/0/gpu/0000000000000001"), junkValue(ks.ChunkKey(pod1, tier.GPU, 9), "\x10short"),
		clientv3.OpPut(ks.EndpointKey(pod2), "{not json"), w.put(blk(pod0, tier.GPU, 2)))
	got, _ := lookup(t, r, w, model, []uint64{1, 2}, nil)
	if len(got) != 1 || got[0].Blocks != 2 {
		t.Fatalf("the index did not go on after malformed keys: %+v", got)
	}
	wants := map[string]float64{"chunks": 5, "blocks": 1, "unknown": 1, "endpoints": 1}
	// The reflector counts a watch response's bad keys once the response
	// is applied, so a Lookup can see its last revision first.
	waitFor(t, "the malformed keys counted", func() bool {
		for kind, want := range wants {
			if r.counter(t, r.srv.m.malformed.WithLabelValues(kind)) < want {
				return false
			}
		}
		return true
	})
	for kind, want := range wants {
		if n := r.counter(t, r.srv.m.malformed.WithLabelValues(kind)); n != want {
			t.Errorf("malformed_total{kind=%s} = %v, want %v", kind, n, want)
		}
	}
}

func TestListEndpoints(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	seen := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	other := keyspace.Endpoint{Model: "m2", Pod: "p"}
	w.commit(
		w.record(pod0, keyspace.EndpointRecord{BlockSize: 16, LastRecord: seen, Topic: "kvindex-events", Partition: 3}),
		w.put(blk(pod0, tier.GPU, 1)), w.put(blk(pod0, tier.GPU, 2)), w.put(blk(pod0, tier.Disk, 2)),
		w.put(blk(pod1, tier.CPU, 1)), // no record: listed with its blocks
		w.record(other, keyspace.EndpointRecord{LastRecord: seen, HashMode: keyspace.HashModeToken}),
	)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	lookup(t, r, w, model, nil, nil) // barrier
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tc := range []struct {
		name  string
		model string
		want  []*kvindexv1.EndpointInfo
	}{
		{name: "one_model", model: model, want: []*kvindexv1.EndpointInfo{
			{Model: model, Endpoint: &kvindexv1.Endpoint{Pod: pod1.Pod}, CpuBlocks: 1},
			{Model: model, Endpoint: &kvindexv1.Endpoint{Pod: pod0.Pod}, GpuBlocks: 2, DiskBlocks: 1, BlockSize: 16, Partition: 3, LastSeen: timestamppb.New(seen), HashMode: kvindexv1.HashMode_HASH_MODE_ENGINE},
		}},
		{name: "every_model", want: []*kvindexv1.EndpointInfo{
			{Model: "m2", Endpoint: &kvindexv1.Endpoint{Pod: "p"}, LastSeen: timestamppb.New(seen), HashMode: kvindexv1.HashMode_HASH_MODE_TOKEN},
			{Model: model, Endpoint: &kvindexv1.Endpoint{Pod: pod1.Pod}, CpuBlocks: 1},
			{Model: model, Endpoint: &kvindexv1.Endpoint{Pod: pod0.Pod}, GpuBlocks: 2, DiskBlocks: 1, BlockSize: 16, Partition: 3, LastSeen: timestamppb.New(seen), HashMode: kvindexv1.HashMode_HASH_MODE_ENGINE},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: tc.model})
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(tc.want, resp.Endpoints, protocmp.Transform()); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
	// Deleting the record drops no block; the endpoint stays while it has
	// blocks.
	w.commit(clientv3.OpDelete(w.ks.EndpointKey(pod0)))
	got, _ := lookup(t, r, w, model, []uint64{1, 2}, []keyspace.Endpoint{pod0})
	if len(got) != 1 || got[0].Endpoint != pod0 || got[0].Blocks != 2 {
		t.Fatalf("after deleting the record: %+v", got)
	}
}

func TestReflectionListsTheService(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client, func(c *Config) { c.Reflection = true })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{serviceName, "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Fatalf("reflection lists %v, want %s among them", names, want)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	e := testutil.StartEtcd(t)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{name: "defaults", mod: func(*Config) {}, ok: true},
		{name: "zero_values_are_invalid", mod: func(c *Config) { *c = Config{Etcd: c.Etcd} }},
		{name: "zero_limit", mod: func(c *Config) { c.MaxCandidates = 0 }},
		{name: "zero_duration", mod: func(c *Config) { c.ShutdownGrace = 0 }},
		{name: "no_listen_addr", mod: func(c *Config) { c.ListenAddr = "" }},
		{name: "zero_keyspace_is_the_default", mod: func(c *Config) { c.Keyspace = keyspace.Keyspace{} }, ok: true},
		{name: "no_etcd", mod: func(c *Config) { c.Etcd = nil }},
		{name: "negative_limit", mod: func(c *Config) { c.MaxHashes = -1 }},
		{name: "backoff_out_of_order", mod: func(c *Config) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond }},
		{name: "barrier_timeout_over_max", mod: func(c *Config) { c.BarrierTimeout = 2 * time.Minute }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Etcd = e.Client
			tc.mod(&c)
			err := c.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestRunStoppedBeforeServing: a Run whose context is already done (Ctrl-C
// while the process starts) shuts down and returns nil, also when its stop
// reaches the gRPC server before Serve does (Serve then returns
// grpc.ErrServerStopped, which is our own stop, not a failure).
func TestRunStoppedBeforeServing(t *testing.T) {
	e := testutil.StartEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 20 {
		cfg := DefaultConfig()
		cfg.Etcd = e.Client
		cfg.ListenAddr = "127.0.0.1:0"
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Run(ctx); err != nil {
			t.Fatalf("run %d: Run with a done context = %v, want nil", i, err)
		}
	}
}

// TestDuplicateHoldsGauge: a key hash two chunks of one (endpoint, tier)
// hold (a chunk a writer never leaves) shows in
// kvindex_indexd_duplicate_holds after a list and through the watch, and
// leaves it when the extra chunk goes, the block still served by the
// other.
func TestDuplicateHoldsGauge(t *testing.T) {
	e := testutil.StartEtcd(t)
	w := newWriter(t, e.Client)
	ks := keyspace.Default()
	extra := func(seq uint64, keys ...uint64) clientv3.Op {
		es := make([]keyspace.ChunkEntry, len(keys))
		for i, k := range keys {
			es[i] = keyspace.ChunkEntry{Key: k}
		}
		return clientv3.OpPut(ks.ChunkKey(pod0, tier.GPU, seq), string(keyspace.AppendChunkValue(nil, es, false)))
	}
	w.commit(w.record(pod0, keyspace.EndpointRecord{}), w.put(blk(pod0, tier.GPU, 1)), extra(9, 1, 5))
	r := startReplica(t, e.Client)
	r.waitServing(t)
	gauge := func() float64 {
		t.Helper()
		mfs, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvindex_indexd_duplicate_holds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no kvindex_indexd_duplicate_holds")
		return 0
	}
	if g := gauge(); g != 1 {
		t.Fatalf("duplicate holds after the list = %v, want 1", g)
	}
	w.commit(extra(10, 5, 1)) // 1 and 5 held twice more, through the watch
	lookup(t, r, w, model, []uint64{1}, nil)
	if g := gauge(); g != 3 {
		t.Fatalf("duplicate holds through the watch = %v, want 3", g)
	}
	w.commit(clientv3.OpDelete(ks.ChunkKey(pod0, tier.GPU, 9)), clientv3.OpDelete(ks.ChunkKey(pod0, tier.GPU, 10)))
	got, _ := lookup(t, r, w, model, []uint64{1}, nil)
	if g := gauge(); g != 0 || len(got) != 1 || got[0].Blocks != 1 {
		t.Fatalf("after the extra chunks went: duplicate holds %v, lookup %+v; want 0 and block 1 still served", g, got)
	}
}

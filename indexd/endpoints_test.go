package indexd

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// longPod returns a distinct pod name of n bytes (the attack used 480).
func longPod(i, n int) string {
	s := fmt.Sprintf("pod-%06d-", i)
	return s + strings.Repeat("x", n-len(s))
}

// putEndpoints writes an endpoints/ record for each of eps, many per
// transaction, and returns the revision of the last write.
func putEndpoints(t *testing.T, cli *clientv3.Client, eps []keyspace.Endpoint) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	ks := keyspace.Default()
	rec, err := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var rev int64
	for chunk := range slices.Chunk(eps, 100) {
		ops := make([]clientv3.Op, len(chunk))
		for i, ep := range chunk {
			ops[i] = clientv3.OpPut(ks.EndpointKey(ep), string(rec))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	return rev
}

// listAll walks ListEndpoints pages of model with pageSize and returns the
// endpoints and each page's length.
func listAll(t *testing.T, api kvindexv1.IndexServiceClient, model string, pageSize int32) ([]keyspace.Endpoint, []int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var (
		out   []keyspace.Endpoint
		pages []int
		token string
	)
	for {
		resp, err := api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: model, PageSize: pageSize, PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", len(pages), err)
		}
		if n := proto.Size(resp); n > 4<<20 {
			t.Fatalf("page %d is %d bytes, over gRPC's default 4 MiB receive limit", len(pages), n)
		}
		for _, e := range resp.Endpoints {
			out = append(out, keyspace.Endpoint{Model: e.Model, Pod: e.Endpoint.Pod, Rank: e.Endpoint.DpRank})
		}
		pages = append(pages, len(resp.Endpoints))
		if resp.NextPageToken == "" {
			return out, pages
		}
		if resp.NextPageToken == token {
			t.Fatalf("page %d repeats its token", len(pages))
		}
		token = resp.NextPageToken
	}
}

func sortedEndpoints(eps []keyspace.Endpoint, model string) []keyspace.Endpoint {
	var out []keyspace.Endpoint
	for _, ep := range eps {
		if model == "" || ep.Model == model {
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b keyspace.Endpoint) int {
		if a.Model != b.Model {
			return strings.Compare(a.Model, b.Model)
		}
		if a.Pod != b.Pod {
			return strings.Compare(a.Pod, b.Pod)
		}
		return int(a.Rank) - int(b.Rank)
	})
	return out
}

func TestListEndpointsPaging(t *testing.T) {
	e := testutil.StartEtcd(t)
	var eps []keyspace.Endpoint
	for i := range 2500 {
		m := "model-a"
		if i%5 == 0 {
			m = "model-b"
		}
		eps = append(eps, keyspace.Endpoint{Model: m, Pod: longPod(i/2, 480), Rank: uint32(i % 2)})
	}
	putEndpoints(t, e.Client, eps)
	r := startReplica(t, e.Client, func(c *Config) { c.ListPageSize, c.MaxListPageSize = 300, 700 })
	r.waitServing(t)
	eventually(t, "every endpoint to be indexed", func() bool {
		ix := r.srv.refl.current()
		infos, _ := ix.ListEndpoints("")
		return len(infos) == len(eps)
	})

	for _, tc := range []struct {
		name      string
		model     string
		pageSize  int32
		wantPages []int
	}{
		{name: "server_default_page_size", pageSize: 0, wantPages: []int{300, 300, 300, 300, 300, 300, 300, 300, 100}},
		{name: "page_size_above_the_maximum_is_lowered", pageSize: 100000, wantPages: []int{700, 700, 700, 400}},
		{name: "small_pages_of_one_model", model: "model-b", pageSize: 120, wantPages: []int{120, 120, 120, 120, 20}},
		{name: "one_page_exactly", model: "model-b", pageSize: 500, wantPages: []int{500}},
		{name: "unknown_model", model: "nope", pageSize: 10, wantPages: []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, pages := listAll(t, r.api, tc.model, tc.pageSize)
			if diff := gocmp.Diff(sortedEndpoints(eps, tc.model), got); diff != "" {
				t.Fatalf("endpoints (-want +got):\n%s", diff)
			}
			if diff := gocmp.Diff(tc.wantPages, pages); diff != "" {
				t.Fatalf("page sizes (-want +got):\n%s", diff)
			}
		})
	}

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	first, err := r.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: "model-a", PageSize: 2})
	if err != nil || first.NextPageToken == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	t.Run("token_outlives_its_endpoint_and_works_on_another_replica", func(t *testing.T) {
		// The endpoint the token names goes away, and one before it
		// comes: the next page still starts right after the token's
		// position, on a replica that never saw the first call.
		last := first.Endpoints[1]
		gone := keyspace.Endpoint{Model: last.Model, Pod: last.Endpoint.Pod, Rank: last.Endpoint.DpRank}
		early := keyspace.Endpoint{Model: "model-a", Pod: "a-new-pod"}
		if _, err := e.Client.Delete(ctx, keyspace.Default().EndpointKey(gone)); err != nil {
			t.Fatal(err)
		}
		rev := putEndpoints(t, e.Client, []keyspace.Endpoint{early})
		r2 := startReplica(t, e.Client)
		r2.waitServing(t)
		eventually(t, "the second replica to catch up", func() bool { return r2.srv.refl.current().Revision() >= rev })
		resp, err := r2.api.ListEndpoints(ctx, &kvindexv1.ListEndpointsRequest{Model: "model-a", PageSize: 1, PageToken: first.NextPageToken})
		if err != nil {
			t.Fatal(err)
		}
		want := sortedEndpoints(eps, "model-a")[2]
		if got := resp.Endpoints[0]; got.Endpoint.Pod != want.Pod || got.Endpoint.DpRank != want.Rank {
			t.Fatalf("next page starts at %v, want %v", got.Endpoint, want)
		}
		if resp.Revision < rev {
			t.Fatalf("page revision %d, want at least %d", resp.Revision, rev)
		}
	})

	forged := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	for _, tc := range []struct {
		name    string
		req     *kvindexv1.ListEndpointsRequest
		wantMsg string
	}{
		{name: "negative_page_size", req: &kvindexv1.ListEndpointsRequest{PageSize: -1}, wantMsg: "page_size -1 is negative"},
		{name: "token_of_another_model", req: &kvindexv1.ListEndpointsRequest{Model: "model-b", PageToken: first.NextPageToken}, wantMsg: "another model"},
		{name: "token_not_base64", req: &kvindexv1.ListEndpointsRequest{PageToken: "not a token!"}, wantMsg: "page_token is not one this API issued"},
		{name: "token_of_another_version", req: &kvindexv1.ListEndpointsRequest{PageToken: forged([]byte{9, 1, 'm', 1, 'p', 0})}, wantMsg: "unknown version"},
		{name: "token_truncated", req: &kvindexv1.ListEndpointsRequest{PageToken: first.NextPageToken[:len(first.NextPageToken)/2]}, wantMsg: "page_token"},
		{name: "token_with_an_empty_pod", req: &kvindexv1.ListEndpointsRequest{PageToken: forged([]byte{1, 1, 'm', 0, 0})}, wantMsg: "bad names"},
		{name: "token_too_long", req: &kvindexv1.ListEndpointsRequest{PageToken: strings.Repeat("A", maxPageTokenLen+1)}, wantMsg: "too long"},
		{name: "invalid_model", req: &kvindexv1.ListEndpointsRequest{Model: strings.Repeat("m", keyspace.MaxNameLen+1)}, wantMsg: "model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.api.ListEndpoints(ctx, tc.req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("error = %v, want INVALID_ARGUMENT containing %q", err, tc.wantMsg)
			}
		})
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	for _, ep := range []keyspace.Endpoint{
		{Model: "m", Pod: "p"},
		{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 7},
		{Model: strings.Repeat("é", keyspace.MaxNameLen/2), Pod: strings.Repeat("p", keyspace.MaxNameLen), Rank: math.MaxUint32},
		{Model: "nl\nmodel", Pod: "nul\x00pod"},
	} {
		tok := encodePageToken(ep)
		got, err := decodePageToken(tok)
		if err != nil || got != ep {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", ep, got, err)
		}
		if len(tok) > maxPageTokenLen {
			t.Fatalf("token of %+v is %d bytes, over maxPageTokenLen %d", ep, len(tok), maxPageTokenLen)
		}
	}
}

// FuzzPageToken decodes arbitrary page tokens: nothing panics, every
// rejection is ErrInvalidArgument, and an accepted token is exactly the
// one its endpoint encodes to.
func FuzzPageToken(f *testing.F) {
	f.Add(encodePageToken(keyspace.Endpoint{Model: "m", Pod: "p", Rank: 3}))
	f.Add(encodePageToken(keyspace.Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0"}))
	f.Add("")
	f.Add("AQFtAXAA")
	f.Add("AQFtAXAA====")
	f.Fuzz(func(t *testing.T, tok string) {
		ep, err := decodePageToken(tok)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("rejection %v is not ErrInvalidArgument", err)
			}
			return
		}
		if again := encodePageToken(ep); again != tok {
			t.Fatalf("accepted %q, which re-encodes to %q", tok, again)
		}
	})
}

// TestListPageSizeLimitFits checks ListPageSizeLimit's promise: a page of
// that many endpoints with the longest names and widest numbers, and the
// longest page token, encodes to under gRPC's default 4 MiB receive
// limit; and Validate holds MaxListPageSize to it.
func TestListPageSizeLimitFits(t *testing.T) {
	widest := &kvindexv1.EndpointInfo{
		Model:     strings.Repeat("m", keyspace.MaxNameLen),
		Endpoint:  &kvindexv1.Endpoint{Pod: strings.Repeat("p", keyspace.MaxNameLen), DpRank: math.MaxUint32},
		GpuBlocks: math.MaxUint64, CpuBlocks: math.MaxUint64, DiskBlocks: math.MaxUint64,
		LastSeen:  timestamppb.New(time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)),
		BlockSize: math.MaxUint32, Partition: -1,
	}
	resp := &kvindexv1.ListEndpointsResponse{
		Revision:      math.MaxInt64,
		NextPageToken: strings.Repeat("A", maxPageTokenLen),
		Endpoints:     slices.Repeat([]*kvindexv1.EndpointInfo{widest}, ListPageSizeLimit),
	}
	if n := proto.Size(resp); n > 4<<20 {
		t.Fatalf("a page of %d of the widest endpoints is %d bytes, over 4 MiB", ListPageSizeLimit, n)
	}
	e := testutil.StartEtcd(t)
	c := DefaultConfig()
	c.Etcd = e.Client
	for _, tc := range []struct {
		name          string
		size, maxSize int
		ok            bool
	}{
		{name: "largest_allowed", size: 10, maxSize: ListPageSizeLimit, ok: true},
		{name: "over_the_limit", size: 10, maxSize: ListPageSizeLimit + 1},
		{name: "default_over_max", size: 20, maxSize: 10},
		{name: "default_over_default_max", size: DefaultMaxListPageSize + 1, maxSize: DefaultMaxListPageSize},
		{name: "zero_size", maxSize: DefaultMaxListPageSize},
		{name: "zero_max", size: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.ListPageSize, c.MaxListPageSize = tc.size, tc.maxSize
			err := c.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate(ListPageSize %d, MaxListPageSize %d) = %v, want ok %v", tc.size, tc.maxSize, err, tc.ok)
			}
		})
	}
}

// rawCodec sends a request's bytes as they are, to put malformed protobuf
// on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error {
	return errors.New("rawCodec: no replies expected")
}
func (rawCodec) Name() string { return "proto" }

// TestMalformedRequest sends bytes that are not a valid request straight
// to the server. gRPC on its own answers INTERNAL ("failed to unmarshal")
// before any handler code runs (grpc-go's serverStream.RecvMsg); indexd's
// codec defers the decoding error to the handler (deferredCodec), which
// answers INVALID_ARGUMENT naming the method, counted under that code.
func TestMalformedRequest(t *testing.T) {
	e := testutil.StartEtcd(t)
	r := startReplica(t, e.Client)
	r.waitServing(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tc := range []struct {
		name   string
		method string
		body   []byte
	}{
		{name: "lookup_truncated_field", method: "Lookup", body: []byte{0x0a, 0x05, 'm'}},
		{name: "lookup_model_not_utf8", method: "Lookup", body: []byte{0x0a, 0x01, 0xff}},
		{name: "lookup_bad_wire_type", method: "Lookup", body: []byte{0x0f}},
		{name: "list_endpoints_token_not_utf8", method: "ListEndpoints", body: []byte{0x1a, 0x02, 0xc3, 0x28}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reply []byte
			err := r.conn.Invoke(ctx, "/kvindex.v1.IndexService/"+tc.method, tc.body, &reply, grpc.ForceCodecV2(rawCodec{}))
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.method+" request is not a valid protobuf message") {
				t.Fatalf("error = %v, want INVALID_ARGUMENT saying the %s request does not decode", err, tc.method)
			}
		})
	}
	if n := r.counter(t, r.srv.m.requests.WithLabelValues("Lookup", codes.InvalidArgument.String())); n != 3 {
		t.Errorf("requests_total{Lookup,InvalidArgument} = %v, want 3", n)
	}
	// The replica is unharmed.
	if _, err := r.api.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, BlockHashes: []uint64{1}}); err != nil {
		t.Fatalf("Lookup after malformed requests: %v", err)
	}
}

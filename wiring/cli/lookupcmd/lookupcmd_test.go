package lookupcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
	"github.com/kvindex/kvindex/internal/tlsfiles"
	"github.com/spf13/cobra"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.LeakOptions()...)
}

const model = "meta-llama/Llama-3.1-8B-Instruct"

// startIndex writes a small index into etcd and serves it; it returns
// indexd's address once every write is applied.
func startIndex(t *testing.T) string {
	t.Helper()
	return startIndexWith(t, nil)
}

// chunkPut is the put of a chunk holding keys, as the ingester writes it
// (in token mode, withEngine, each with a made-up engine hash).
func chunkPut(key string, withEngine bool, keys ...uint64) clientv3.Op {
	es := make([]keyspace.ChunkEntry, len(keys))
	for i, k := range keys {
		es[i] = keyspace.ChunkEntry{Key: k, Engine: 0xaa00 + uint64(i)}
	}
	return clientv3.OpPut(key, string(keyspace.AppendChunkValue(nil, es, withEngine)))
}

// startIndexWith is startIndex with extra etcd operations in the same
// transaction and a change to indexd's config.
func startIndexWith(t *testing.T, mod func(*indexd.Config), extra ...clientv3.Op) string {
	t.Helper()
	e := testutil.StartEtcd(t)
	ks := keyspace.Default()
	ep0 := keyspace.Endpoint{Model: model, Pod: "vllm-0"}
	ep1 := keyspace.Endpoint{Model: model, Pod: "team-a/vllm 1", Rank: 1}
	rec, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeEngine, BlockSize: 16, LastRecord: time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC), Partition: 2}).Marshal()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	ops := append([]clientv3.Op{
		clientv3.OpPut(ks.EndpointKey(ep0), string(rec)),
		chunkPut(ks.ChunkKey(ep0, tier.GPU, 0), false, 0xe5068d13bba8906f),
		chunkPut(ks.ChunkKey(ep0, tier.CPU, 0), false, 0x1c92a7b9b9bec94f),
		chunkPut(ks.ChunkKey(ep1, tier.Disk, 0), false, 0xe5068d13bba8906f),
		clientv3.OpPut(ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events", Partition: 2}), "41"),
	}, extra...)
	_, err := e.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	cfg := indexd.DefaultConfig()
	cfg.Etcd, cfg.ListenAddr = e.Client, "127.0.0.1:0"
	if mod != nil {
		mod(&cfg)
	}
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
	healthAddr := srv.Addr()
	if h := srv.HealthAddr(); h != nil {
		healthAddr = h // the API port may require TLS; the health port never does
	}
	conn, err := grpc.NewClient(healthAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.WaitServing(t, ctx, conn)
	return srv.Addr().String()
}

func run(t *testing.T, newCmd func() *cobra.Command, args ...string) (string, error) {
	t.Helper()
	cmd := newCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestLookupCommand(t *testing.T) {
	addr := startIndex(t)
	hashes := []string{"e5068d13bba8906f", "0x1C92A7B9B9BEC94F"}

	out, err := run(t, NewCommand, append([]string{"--index", addr, "--model", model, "-o", "json", "--after", "kvindex-events/2@40"}, hashes...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got lookupJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	want := lookupJSON{
		Endpoints: []matchJSON{
			{Pod: "vllm-0", Blocks: 2, BlockSize: 16, Tiers: []string{"gpu", "cpu"}},
			{Pod: "team-a/vllm 1", DPRank: 1, Blocks: 1, Tiers: []string{"disk"}},
		},
		Revision: got.Revision,
		Offsets:  map[string]int64{"kvindex-events/2": 41},
	}
	if diff := gocmp.Diff(want, got); diff != "" || got.Revision == 0 {
		t.Fatalf("json (-want +got):\n%s", diff)
	}

	out, err = run(t, NewCommand, append([]string{"--index", addr, "--model", model, "--candidate", "team-a/vllm 1#1"}, hashes...)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"POD", "team-a/vllm 1", "1/2", "disk×1", "kvindex-events/2=41"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "vllm-0") {
		t.Errorf("candidate filter ignored:\n%s", out)
	}

	// Nothing matched: a cold prompt of a known model, and a model the
	// index knows no endpoint of (a misspelt --model), read differently.
	for _, tc := range []struct{ model, want string }{
		{model, "(no endpoint holds the first block)"},
		{"meta-llama/Llama-3.1-8B-Instruc", `(no endpoint of model meta-llama/Llama-3.1-8B-Instruc is known to the index)`},
	} {
		out, err := run(t, NewCommand, "--index", addr, "--model", tc.model, "0123")
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("lookup --model %s of an unheld hash = %v, want %q in:\n%s", tc.model, err, tc.want, out)
		}
	}

	for _, tc := range []struct {
		name string
		args []string
		want error
	}{
		{name: "bad_hash", args: []string{"--index", addr, "--model", model, "xyz"}, want: errUsage},
		{name: "missing_model", args: []string{"--index", addr, "e5068d13bba8906f"}, want: errUsage},
		{name: "bad_output", args: []string{"--index", addr, "--model", model, "-o", "yaml", "01"}, want: errUsage},
		{name: "bad_after", args: []string{"--index", addr, "--model", model, "--after", "x", "01"}, want: errUsage},
		{name: "server_limit", args: append([]string{"--index", addr, "--model", strings.Repeat("m", 600)}, hashes...), want: client.ErrInvalidArgument},
		{name: "model_not_utf8", args: append([]string{"--index", addr, "--model", "bad\xffmodel"}, hashes...), want: client.ErrInvalidArgument},
		{name: "zero_timeout", args: []string{"--index", addr, "--model", model, "--timeout", "0s", "01"}, want: errUsage},
		{name: "negative_timeout", args: []string{"--index", addr, "--model", model, "--timeout", "-1s", "01"}, want: errUsage},
		{name: "negative_barrier_timeout", args: []string{"--index", addr, "--model", model, "--after", "t/0@1", "--barrier-timeout", "-1s", "01"}, want: errUsage},
		{name: "barrier_timeout_without_after", args: []string{"--index", addr, "--model", model, "--barrier-timeout", "1s", "01"}, want: errUsage},
		{name: "negative_offset", args: []string{"--index", addr, "--model", model, "--after", "kvindex-events/0@-1", "01"}, want: errUsage},
		{name: "bad_topic_after", args: []string{"--index", addr, "--model", model, "--after", "bad topic/0@1", "01"}, want: errUsage},
		{name: "empty_index", args: []string{"--index", "", "--model", model, "01"}, want: errUsage},
		{name: "barrier_timeout_not_shorter", args: []string{"--index", addr, "--model", model, "--after", "t/0@1", "--timeout", "1s", "--barrier-timeout", "1s", "01"}, want: errUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, NewCommand, tc.args...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error = %v, want %v", err, tc.want)
			}
			// Bad usage exits 2, as in inspect and migrate (before: 1).
			var coded interface{ ExitCode() int }
			if tc.want == errUsage && (!errors.As(err, &coded) || coded.ExitCode() != 2) {
				t.Fatalf("error = %v: not a usage error of exit status 2", err)
			}
		})
	}
}

func TestEndpointsCommand(t *testing.T) {
	addr := startIndex(t)
	out, err := run(t, NewEndpointsCommand, "--index", addr, "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var got endpointsJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	seen := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	want := endpointsJSON{Revision: got.Revision, MaxRevision: got.Revision, Endpoints: []endpointJSON{
		{Model: model, Pod: "team-a/vllm 1", DPRank: 1, DiskBlocks: 1, HashMode: "unspecified"},
		{Model: model, Pod: "vllm-0", GPUBlocks: 1, CPUBlocks: 1, BlockSize: 16, HashMode: "engine", Partition: 2, LastSeen: &seen},
	}}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Fatalf("json (-want +got):\n%s", diff)
	}
	out, err = run(t, NewEndpointsCommand, "--index", addr, "--model", "other")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "0 endpoints") {
		t.Fatalf("model filter: %s", out)
	}
	out, err = run(t, NewEndpointsCommand, "--index", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MODEL", "vllm-0", "2026-11-30T05:00:00Z", "2 endpoints"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestLookupCommandArgs(t *testing.T) {
	_, err := run(t, NewCommand, "--model", model)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "no block hashes") {
		t.Fatalf("no hashes: %v, want a usage error saying the hashes are missing", err)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"hashes_and_tokens", []string{"--model", model, "--tokens", "1,2", "e5068d13bba8906f"}, "not both"},
		{"lora_without_tokens", []string{"--model", model, "--lora-name", "l", "e5068d13bba8906f"}, "--lora-name goes with --tokens"},
		{"block_size_without_tokens", []string{"--model", model, "--block-size", "16", "e5068d13bba8906f"}, "--block-size goes with --tokens"},
		{"bad_token", []string{"--model", model, "--tokens", "1,x"}, `token 2 "x" is not a token id`},
		{"token_too_big", []string{"--model", model, "--tokens", "4294967296"}, "is not a token id"},
		{"no_token", []string{"--model", model, "--tokens", " , "}, "holds no token id"},
		{"empty_token", []string{"--model", model, "--tokens", "1000,,1001"}, "token 2 is empty"},
		{"trailing_comma", []string{"--model", model, "--tokens", "1000,1001,"}, "token 3 is empty"},
		{"missing_file", []string{"--model", model, "--tokens", "@" + dir + "/nope"}, "--tokens @"},
		{"bad_multimodal", []string{"--model", model, "--tokens", "1", "--multimodal", "img:3"}, "want HASH:OFFSET:LENGTH"},
		{"zero_length_multimodal", []string{"--model", model, "--tokens", "1", "--multimodal", "img:3:0"}, "length of at least 1"},
		{"zero_block_size", []string{"--model", model, "--tokens", "1", "--block-size", "0"}, "--block-size must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, NewCommand, tc.args...)
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
	for _, args := range [][]string{{"--timeout", "0s"}, {"--timeout", "-1s"}, {"-o", "yaml"}} {
		if _, err := run(t, NewEndpointsCommand, args...); !errors.Is(err, errUsage) {
			t.Errorf("endpoints %v: %v, want a usage error", args, err)
		}
	}
}

// TestLookupTimeoutBoundsTheBarrier: --timeout bounds the whole call, so
// the barrier waits nine tenths of it (or --barrier-timeout), not the
// server's default 5 s, and the error names the lagging partition.
func TestLookupTimeoutBoundsTheBarrier(t *testing.T) {
	addr := startIndex(t) // kvindex-events/2 has applied up to next offset 41
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{name: "nine_tenths_of_timeout", args: []string{"--timeout", "300ms"}, want: "waited 270ms"},
		{name: "barrier_timeout_flag", args: []string{"--timeout", "2s", "--barrier-timeout", "100ms"}, want: "waited 100ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--index", addr, "--model", model, "--after", "kvindex-events/2@41"}, tc.args...)
			_, err := run(t, NewCommand, append(args, "e5068d13bba8906f")...)
			if !errors.Is(err, client.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "kvindex-events/2") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want ErrDeadlineExceeded naming kvindex-events/2 and %q", err, tc.want)
			}
		})
	}
}

// TestTablesQuoteUnprintableNames: a name with a control character is
// quoted in the tables, so it cannot split a row; JSON keeps it as it is.
func TestTablesQuoteUnprintableNames(t *testing.T) {
	ks := keyspace.Default()
	odd := []string{"nl\npod", "nul\x00pod", "tab\tpod", `"quoted"`}
	var ops []clientv3.Op
	for _, pod := range odd {
		ops = append(ops, chunkPut(ks.ChunkKey(keyspace.Endpoint{Model: model, Pod: pod}, tier.GPU, 0), false, 0xe5068d13bba8906f))
	}
	ops = append(ops, chunkPut(ks.ChunkKey(keyspace.Endpoint{Model: "m\x1b[31m", Pod: "p"}, tier.GPU, 0), false, 1))
	addr := startIndexWith(t, nil, ops...)

	lookupOut, err := run(t, NewCommand, "--index", addr, "--model", model, "e5068d13bba8906f")
	if err != nil {
		t.Fatal(err)
	}
	endpointsOut, err := run(t, NewEndpointsCommand, "--index", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		out       string
		wantLines int
		want      []string
	}{
		// header, 6 endpoints, the revision line
		{name: "lookup", out: lookupOut, wantLines: 8, want: []string{`"nl\npod"`, `"nul\x00pod"`, `"tab\tpod"`, `"\"quoted\""`, "vllm-0"}},
		// header, 7 endpoints, the footer
		{name: "endpoints", out: endpointsOut, wantLines: 9, want: []string{`"nl\npod"`, `"m\x1b[31m"`, "team-a/vllm 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if n := strings.Count(tc.out, "\n"); n != tc.wantLines {
				t.Errorf("%d lines, want %d:\n%s", n, tc.wantLines, tc.out)
			}
			if strings.ContainsAny(tc.out, "\x00\x1b\t") {
				t.Errorf("raw control characters in the table:\n%q", tc.out)
			}
			for _, w := range tc.want {
				if !strings.Contains(tc.out, w) {
					t.Errorf("table lacks %s:\n%s", w, tc.out)
				}
			}
		})
	}

	out, err := run(t, NewEndpointsCommand, "--index", addr, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got endpointsJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, e := range got.Endpoints {
		pods = append(pods, e.Pod)
	}
	if !slices.Contains(pods, "nl\npod") || !slices.Contains(pods, "nul\x00pod") {
		t.Fatalf("JSON pods %q lack the names as they are", pods)
	}
}

// TestEndpointsCommandWalksPages: more endpoints than one page holds are
// all listed.
func TestEndpointsCommandWalksPages(t *testing.T) {
	ks := keyspace.Default()
	var ops []clientv3.Op
	for i := range 30 {
		ops = append(ops, chunkPut(ks.ChunkKey(keyspace.Endpoint{Model: "paged", Pod: fmt.Sprintf("pod-%02d", i)}, tier.CPU, 0), false, 1))
	}
	addr := startIndexWith(t, func(c *indexd.Config) { c.ListPageSize = 7 }, ops...)
	out, err := run(t, NewEndpointsCommand, "--index", addr, "--model", "paged", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got endpointsJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Endpoints) != 30 || got.Endpoints[0].Pod != "pod-00" || got.Endpoints[29].Pod != "pod-29" || got.Revision != got.MaxRevision {
		t.Fatalf("listed %d endpoints (want 30 in order) at revisions %d..%d", len(got.Endpoints), got.Revision, got.MaxRevision)
	}
}

// TestLookupTokensCommand stores canonical keys (client.TokenKeys) for
// token-mode endpoints and looks them up by token ids: keyed by the
// replica (with extras), from a file, and keyed here at --block-size.
func TestLookupTokensCommand(t *testing.T) {
	ks := keyspace.Default()
	toks := []uint32{128000, 9906, 1917, 0, 315, 279, 1917, 13, 5, 6}
	rec := func(size uint32) string {
		v, _ := (&keyspace.EndpointRecord{HashMode: keyspace.HashModeToken, BlockSize: size}).Marshal()
		return string(v)
	}
	tok4 := keyspace.Endpoint{Model: model, Pod: "tok-4"}
	tok2 := keyspace.Endpoint{Model: model, Pod: "tok-2"}
	lora := keyspace.Endpoint{Model: model, Pod: "tok-lora"}
	ops := []clientv3.Op{clientv3.OpPut(ks.EndpointKey(tok4), rec(4)), clientv3.OpPut(ks.EndpointKey(tok2), rec(2)), clientv3.OpPut(ks.EndpointKey(lora), rec(4))}
	ops = append(ops,
		chunkPut(ks.ChunkKey(tok4, tier.GPU, 0), true, client.TokenKeys(client.TokenPrompt{TokenIDs: toks}, 4)...),
		chunkPut(ks.ChunkKey(tok2, tier.CPU, 0), true, client.TokenKeys(client.TokenPrompt{TokenIDs: toks}, 2)[:3]...),
		chunkPut(ks.ChunkKey(lora, tier.GPU, 0), true, client.TokenKeys(client.TokenPrompt{TokenIDs: toks, LoRAName: "sql-lora"}, 4)[:1]...))
	addr := startIndexWith(t, nil, ops...)
	list := "128000,9906,1917,0,315,279,1917,13,5,6"
	file := t.TempDir() + "/prompt.json"
	if err := os.WriteFile(file, []byte("[128000, 9906, 1917, 0,\n 315, 279, 1917, 13, 5, 6]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []matchJSON
	}{
		{"list", []string{"--tokens", list}, []matchJSON{
			{Pod: "tok-2", Blocks: 3, BlockSize: 2, Tiers: []string{"cpu", "cpu", "cpu"}},
			{Pod: "tok-4", Blocks: 2, BlockSize: 4, Tiers: []string{"gpu", "gpu"}},
		}},
		{"file", []string{"--tokens", "@" + file}, []matchJSON{
			{Pod: "tok-2", Blocks: 3, BlockSize: 2, Tiers: []string{"cpu", "cpu", "cpu"}},
			{Pod: "tok-4", Blocks: 2, BlockSize: 4, Tiers: []string{"gpu", "gpu"}},
		}},
		{"lora", []string{"--tokens", list, "--lora-name", "sql-lora"}, []matchJSON{
			{Pod: "tok-lora", Blocks: 1, BlockSize: 4, Tiers: []string{"gpu"}},
		}},
		{"salt_matches_nothing", []string{"--tokens", list, "--cache-salt", "tenant-7"}, nil},
		{"keyed_here_at_block_size", []string{"--tokens", list, "--block-size", "4"}, []matchJSON{
			{Pod: "tok-4", Blocks: 2, BlockSize: 4, Tiers: []string{"gpu", "gpu"}},
		}},
		{"candidates", []string{"--tokens", list, "--candidate", "tok-4"}, []matchJSON{
			{Pod: "tok-4", Blocks: 2, BlockSize: 4, Tiers: []string{"gpu", "gpu"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, NewCommand, append([]string{"--index", addr, "--model", model, "-o", "json"}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var got lookupJSON
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("output is not one JSON object: %v\n%s", err, out)
			}
			if diff := gocmp.Diff(tc.want, got.Endpoints, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
	out, err := run(t, NewCommand, "--index", addr, "--model", model, "--tokens", list)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"BLOCK_SIZE", "TOKENS", "tok-2", "3/5", "6/10", "tok-4", "2/2", "8/10"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestCommandsTLSFlags runs lookup and endpoints against an indexd that
// requires client certificates: with --tls-ca-file, --tls-cert-file,
// --tls-key-file (and --tls-server-name for the name the certificate
// carries) they answer; without a certificate, or in plaintext, they are
// refused; half a key pair is a usage error.
func TestCommandsTLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	srv := ca.Issue(t, "indexd", "indexd.kvindex.svc")
	op := ca.Issue(t, "operator")
	tlsCfg, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := startIndexWith(t, func(c *indexd.Config) { c.TLS, c.HealthListenAddr = tlsCfg, "127.0.0.1:0" })
	good := []string{"--index", addr, "--timeout", "3s", "--tls-ca-file", ca.File, "--tls-cert-file", op.CertFile, "--tls-key-file", op.KeyFile, "--tls-server-name", "indexd.kvindex.svc"}
	out, err := run(t, NewEndpointsCommand, good...)
	if err != nil || !strings.Contains(out, "2 endpoints") {
		t.Fatalf("endpoints over mutual TLS: %v\n%s", err, out)
	}
	out, err = run(t, NewCommand, append(good, "--model", model, "e5068d13bba8906f")...)
	if err != nil || !strings.Contains(out, "vllm-0") {
		t.Fatalf("lookup over mutual TLS: %v\n%s", err, out)
	}
	for name, args := range map[string][]string{
		"plaintext":      {"--index", addr, "--timeout", "2s"},
		"no_certificate": {"--index", addr, "--timeout", "2s", "--tls-ca-file", ca.File, "--tls-server-name", "indexd.kvindex.svc"},
	} {
		if out, err := run(t, NewEndpointsCommand, args...); !errors.Is(err, client.ErrUnavailable) {
			t.Errorf("%s: endpoints = %v, want ErrUnavailable\n%s", name, err, out)
		}
	}
	if _, err := run(t, NewEndpointsCommand, "--index", addr, "--tls-cert-file", op.CertFile); !errors.Is(err, errUsage) {
		t.Errorf("--tls-cert-file without --tls-key-file: %v, want a usage error", err)
	}
}

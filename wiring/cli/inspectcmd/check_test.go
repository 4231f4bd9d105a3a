package inspectcmd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestInspectChecksChunksAgainstRecords: chunks a writer never leaves are
// problems on their keys (entries of the other hash mode's width, a
// sequence at or past chunk_next, a key hash held twice in a tier), and
// chunk keys under no record are named by their endpoint, before, between
// and after the endpoints that have records.
func TestInspectChecksChunksAgainstRecords(t *testing.T) {
	e := testutil.StartEtcd(t)
	ctx := context.Background()
	ks := keyspace.Default()
	put := func(k, v string) {
		t.Helper()
		if _, err := e.Client.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	const model = "m"
	tok := keyspace.Endpoint{Model: model, Pod: "b-token"}
	eng := keyspace.Endpoint{Model: model, Pod: "d-engine"}
	record := func(ep keyspace.Endpoint, mode keyspace.HashMode, next string) {
		put(ks.EndpointKey(ep), fmt.Sprintf(`{"block_size":16,"hash_mode":%q,"last_record":"2026-12-01T12:00:00Z","topic":"t","partition":0,"lease":"2a","chunk_next":%s}`, mode, next))
	}
	chunk := func(ep keyspace.Endpoint, seq uint64, es []keyspace.ChunkEntry, token bool) string {
		k := ks.ChunkKey(ep, tier.GPU, seq)
		put(k, string(keyspace.AppendChunkValue(nil, es, token)))
		return k
	}
	record(tok, keyspace.HashModeToken, `{"gpu":2}`)
	chunk(tok, 0, entries(0x100, 3), true)
	narrow := chunk(tok, 1, entries(0x200, 2), false) // engine-hash width in a token endpoint
	record(eng, keyspace.HashModeEngine, `{"gpu":2}`)
	chunk(eng, 0, entries(0x300, 4), false)
	dup := chunk(eng, 1, append(entries(0x300, 2)[1:], entries(0x400, 1)...), false) // 0x302 again
	past := chunk(eng, 5, entries(0x500, 1), false)                                  // chunk_next is 2
	// Under no record: before the first endpoint, between the two, after
	// the last.
	for _, o := range []struct {
		pod  string
		seqs int
	}{{"a-gone", 2}, {"c-gone", 1}, {"e-gone", 3}} {
		for s := range o.seqs {
			chunk(keyspace.Endpoint{Model: model, Pod: o.pod}, uint64(s), entries(0x600, 1), false)
		}
	}

	var got struct{ Problems []problem }
	if err := json.Unmarshal([]byte(run(t, e, "chunks", "-o", "json")), &got); err != nil {
		t.Fatal(err)
	}
	gone := func(pod string, n int) problem {
		ep := keyspace.Endpoint{Model: model, Pod: pod}
		return problem{Key: ks.EndpointChunksPrefix(ep), Error: fmt.Sprintf("%s under no endpoint record (model %q, pod %q, rank 0)", plural(n, "chunk key"), model, pod)}
	}
	const repair = "; the ingester repairs it when it next rebuilds the endpoint"
	want := []problem{
		gone("a-gone", 2), gone("c-gone", 1), gone("e-gone", 3),
		{Key: narrow, Error: "chunk entries of width 8 in an endpoint of hash mode token" + repair},
		{Key: dup, Error: "1 key hash already in this chunk or an earlier one of gpu (the first 0000000000000302)" + repair},
		{Key: past, Error: "sequence 5 is at or past the record's chunk_next for gpu (2): the next chunk opened there would overwrite it" + repair},
	}
	if diff := cmp.Diff(want, got.Problems); diff != "" {
		t.Fatalf("problems (-want +got):\n%s", diff)
	}

	// The pod scope reads only the pod's range: no other pod's orphans.
	out := run(t, e, "chunks", "--model", model, "--pod", "d-engine")
	if strings.Contains(out, "gone") || !strings.Contains(out, "sequence 5 is at or past") {
		t.Fatalf("chunks of one pod:\n%s", out)
	}
}

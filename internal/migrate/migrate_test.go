package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// v1Writer is the test's own v1 writer: it writes the v1 layout as the v1
// ingester did, from the layout's description (not from this package's
// parser), and remembers what it wrote.
type v1Writer struct {
	t   *testing.T
	cli *clientv3.Client
	ks  keyspace.Keyspace // v1 prefix
	// blocks is every (endpoint, tier, key, engine) written, in insertion
	// order per (endpoint, tier).
	blocks map[epTier][]keyspace.ChunkEntry
	// leaseOf is each block's lease.
	leaseOf map[block]clientv3.LeaseID
	records map[keyspace.Endpoint]keyspace.EndpointRecord
	rng     *rand.Rand
}

type epTier struct {
	ep keyspace.Endpoint
	t  tier.Tier
}

type block struct {
	epTier
	key uint64
}

const leaseTTL = 300 // seconds

func newV1Writer(t *testing.T, cli *clientv3.Client) *v1Writer {
	ks, err := keyspace.New(V1Prefix)
	if err != nil {
		t.Fatal(err)
	}
	return &v1Writer{t: t, cli: cli, ks: ks, blocks: map[epTier][]keyspace.ChunkEntry{}, leaseOf: map[block]clientv3.LeaseID{},
		records: map[keyspace.Endpoint]keyspace.EndpointRecord{}, rng: rand.New(rand.NewPCG(1, 2))}
}

func (w *v1Writer) grant() clientv3.LeaseID {
	w.t.Helper()
	resp, err := w.cli.Grant(context.Background(), leaseTTL)
	if err != nil {
		w.t.Fatal(err)
	}
	return resp.ID
}

func (w *v1Writer) blockKey(ep keyspace.Endpoint, tr tier.Tier, h uint64) string {
	return fmt.Sprintf("%sblocks/%s/%s/%d/%s/%016x", V1Prefix, url.PathEscape(ep.Model), url.PathEscape(ep.Pod), ep.Rank, tr, h)
}

// endpoint writes ep's record and member key, then its blocks: per tier,
// n blocks on shards of shardKeys keys each, in windows of a few keys in
// an order unlike the key order, as an ingester would have stored them.
func (w *v1Writer) endpoint(ep keyspace.Endpoint, mode keyspace.HashMode, part int32, tiers map[tier.Tier]int, shardKeys int) {
	w.t.Helper()
	ctx := context.Background()
	seq := uint64(7)
	group := int64(0)
	rec := keyspace.EndpointRecord{BlockSize: 16, HashMode: mode, Seq: &seq, BatchTS: 1.7e9, Incarnation: "inc-1",
		LastRecord: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), Topic: "kvindex-events", Partition: part,
		Lease: keyspace.LeaseID(w.grant()), TierLeases: map[string][]keyspace.LeaseShard{}, AttentionGroup: &group, MediumMap: "mm1"}
	type pending struct {
		key, value string
		lease      clientv3.LeaseID
	}
	var puts []pending
	for _, tr := range tier.All {
		n := tiers[tr]
		var shard clientv3.LeaseID
		for i := range n {
			if i%shardKeys == 0 {
				shard = w.grant()
				rec.TierLeases[tr.String()] = append(rec.TierLeases[tr.String()], keyspace.LeaseShard{ID: keyspace.LeaseID(shard)})
			}
			s := rec.TierLeases[tr.String()]
			s[len(s)-1].Keys++
			e := keyspace.ChunkEntry{Key: w.rng.Uint64(), Engine: w.rng.Uint64()}
			value := ""
			if mode == keyspace.HashModeToken {
				value = fmt.Sprintf("%016x", e.Engine)
			} else {
				e.Engine = e.Key
			}
			et := epTier{ep, tr}
			w.blocks[et] = append(w.blocks[et], e)
			w.leaseOf[block{et, e.Key}] = shard
			puts = append(puts, pending{w.blockKey(ep, tr, e.Key), value, shard})
		}
	}
	val, err := rec.Marshal()
	if err != nil {
		w.t.Fatal(err)
	}
	p := keyspace.Partition{Topic: rec.Topic, Partition: part}
	if _, err := w.cli.Txn(ctx).Then(
		clientv3.OpPut(w.ks.EndpointKey(ep), string(val), clientv3.WithLease(clientv3.LeaseID(rec.Lease))),
		clientv3.OpPut(w.ks.MemberKey(p, ep), "", clientv3.WithLease(clientv3.LeaseID(rec.Lease))),
	).Commit(); err != nil {
		w.t.Fatal(err)
	}
	w.records[ep] = rec
	// Windows of 1-5 keys, each one transaction (one create revision),
	// in insertion order: the key order is the hashes', random.
	for len(puts) > 0 {
		n := min(1+w.rng.IntN(5), len(puts))
		var ops []clientv3.Op
		for _, pt := range puts[:n] {
			ops = append(ops, clientv3.OpPut(pt.key, pt.value, clientv3.WithLease(pt.lease)))
		}
		if _, err := w.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			w.t.Fatal(err)
		}
		puts = puts[n:]
	}
	// A window's blocks share a create revision: the migration orders
	// those by hash, so the expectation does too.
	w.sortWindows(ep)
}

// sortWindows orders the remembered blocks of ep as the migration orders
// them (create revision, then hash), reading the revisions back.
func (w *v1Writer) sortWindows(ep keyspace.Endpoint) {
	w.t.Helper()
	for _, tr := range tier.All {
		et := epTier{ep, tr}
		created := map[uint64]int64{}
		for _, e := range w.blocks[et] {
			resp, err := w.cli.Get(context.Background(), w.blockKey(ep, tr, e.Key))
			if err != nil || len(resp.Kvs) != 1 {
				w.t.Fatalf("reading back a v1 block: %v", err)
			}
			created[e.Key] = resp.Kvs[0].CreateRevision
		}
		bs := w.blocks[et]
		sortEntries(bs, created)
	}
}

func sortEntries(bs []keyspace.ChunkEntry, created map[uint64]int64) {
	for i := 1; i < len(bs); i++ { // insertion sort: stable and short
		for j := i; j > 0; j-- {
			a, b := bs[j-1], bs[j]
			if created[a.Key] < created[b.Key] || created[a.Key] == created[b.Key] && a.Key < b.Key {
				break
			}
			bs[j-1], bs[j] = b, a
		}
	}
}

// v2Index decodes every chunk under ks into blocks in chunk order per
// (endpoint, tier), with each chunk's lease, and checks every chunk's fill.
func v2Index(t *testing.T, cli *clientv3.Client, ks keyspace.Keyspace, chunkSize int) (map[epTier][]keyspace.ChunkEntry, map[block]clientv3.LeaseID) {
	t.Helper()
	resp, err := cli.Get(context.Background(), ks.ChunksPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[epTier][]keyspace.ChunkEntry{}
	leases := map[block]clientv3.LeaseID{}
	seqs := map[epTier]uint64{}
	for _, kv := range resp.Kvs { // key order = sequence order per tier
		c, err := ks.ParseChunkKey(string(kv.Key))
		if err != nil {
			t.Fatal(err)
		}
		view, err := keyspace.ParseChunkValue(kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		et := epTier{c.Endpoint, c.Tier}
		if c.Seq != seqs[et] {
			t.Fatalf("%s: sequence %d, want %d (chunks numbered from 0 without gaps)", kv.Key, c.Seq, seqs[et])
		}
		seqs[et]++
		if view.Len() > chunkSize {
			t.Fatalf("%s holds %d entries, chunk size %d", kv.Key, view.Len(), chunkSize)
		}
		if len(out[et])%chunkSize != 0 {
			t.Fatalf("%s follows a chunk that is not full", kv.Key)
		}
		out[et] = view.AppendEntries(out[et])
		leases[block{et, view.Key(0)}] = clientv3.LeaseID(kv.Lease)
	}
	return out, leases
}

type fixture struct {
	etcd *testutil.Etcd
	w    *v1Writer
	eps  []keyspace.Endpoint
}

func newFixture(t *testing.T) *fixture {
	e := testutil.StartEtcd(t)
	w := newV1Writer(t, e.Client)
	eps := []keyspace.Endpoint{
		{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 0},
		{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 1},
		{Model: "Qwen/Qwen3-32B", Pod: "vllm-b", Rank: 0},
	}
	w.endpoint(eps[0], keyspace.HashModeEngine, 0, map[tier.Tier]int{tier.GPU: 150, tier.CPU: 5}, 100)
	w.endpoint(eps[1], keyspace.HashModeToken, 0, map[tier.Tier]int{tier.GPU: 70, tier.Disk: 3}, 1000)
	w.endpoint(eps[2], keyspace.HashModeToken, 1, map[tier.Tier]int{tier.GPU: 64, tier.CPU: 65, tier.Disk: 1}, 40)
	ctx := context.Background()
	for k, v := range map[string]string{
		V1Prefix + "offsets/kvindex-events/0": "1234",
		V1Prefix + "offsets/kvindex-events/1": "99",
		V1Prefix + "owners/kvindex-events/0":  `{"member_id":"m-1","generation":3,"nonce":"n","claimed":"2026-12-01T12:00:00Z"}`,
	} {
		if _, err := e.Client.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	return &fixture{etcd: e, w: w, eps: eps}
}

func (f *fixture) run(t *testing.T, change func(*Config)) (*Report, error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Etcd = f.etcd.Client
	cfg.MaxTxnOps = 16 // several transactions per endpoint
	cfg.PageSize = 7   // several pages per range
	if change != nil {
		change(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(time.Minute))
	defer cancel()
	return Run(ctx, cfg)
}

// chunkNext is the field of the v2 record this package adds.
type chunkNext struct {
	ChunkNext map[string]uint64 `json:"chunk_next"`
}

func TestMigrate(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.etcd.Client
	// Bad input, reported and not migrated, no crash: a malformed v1 block
	// key, a token-mode block whose value is no engine hash, a block of an
	// endpoint that has no record, and a record that is JSON null (it
	// crashed migrate, decoded as an empty record).
	for k, v := range map[string]string{
		V1Prefix + "endpoints/Qwen%2FQwen3-32B/null-record/0":                                                 "null",
		f.w.blockKey(keyspace.Endpoint{Model: "Qwen/Qwen3-32B", Pod: "null-record", Rank: 0}, tier.GPU, 0xaa): "",
		V1Prefix + "blocks/Qwen%2FQwen3-32B/vllm-b/0/gpu/NOTAHASH":                                            "",
		f.w.blockKey(f.eps[1], tier.GPU, 0x77):                                                                "not-hex",
		f.w.blockKey(keyspace.Endpoint{Model: "Qwen/Qwen3-32B", Pod: "no-record", Rank: 0}, tier.GPU, 0x78):   "",
	} {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}

	rep, err := f.run(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Endpoints != 3 || rep.TokenEndpoints != 2 || rep.Puts == 0 || rep.Transactions < 2 {
		t.Fatalf("report %+v", rep)
	}
	if diff := cmp.Diff(map[string]int{"bad_block_key": 1, "bad_endpoint_record": 1, "bad_engine_hash": 1, "blocks_without_record": 2}, rep.Skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"gpu": 284, "cpu": 70, "disk": 4}, rep.Blocks); diff != "" {
		t.Errorf("blocks per tier (-want +got):\n%s", diff)
	}
	// Each (endpoint, tier) fills ceil(blocks / chunk size) chunks: the
	// fixture's gpu 150 + 70 + 64 blocks, cpu 5 + 0 + 65, disk 0 + 3 + 1
	// (13, 4 and 2 chunks at 24).
	chunks := func(blocks ...int) int {
		n := 0
		for _, b := range blocks {
			n += (b + keyspace.DefaultChunkSize - 1) / keyspace.DefaultChunkSize
		}
		return n
	}
	if diff := cmp.Diff(map[string]int{"gpu": chunks(150, 70, 64), "cpu": chunks(5, 65), "disk": chunks(3, 1)}, rep.Chunks); diff != "" {
		t.Errorf("chunks per tier (-want +got):\n%s", diff)
	}

	// The index: the same blocks, in insertion order, on the same leases.
	got, leases := v2Index(t, cli, keyspace.Default(), keyspace.DefaultChunkSize)
	if diff := cmp.Diff(f.w.blocks, got, cmp.AllowUnexported(epTier{})); diff != "" {
		t.Fatalf("v2 index (-v1 writer +migrated):\n%s", diff)
	}
	for b, id := range leases {
		if want := f.w.leaseOf[b]; id != want {
			t.Errorf("%v: chunk on lease %x, want its first block's %x", b, id, want)
		}
	}

	// The records: every field kept, the lease shards counting chunks,
	// chunk_next per tier.
	for _, ep := range f.eps {
		resp, err := cli.Get(ctx, keyspace.Default().EndpointKey(ep))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%v: no v2 record (%v)", ep, err)
		}
		kv := resp.Kvs[0]
		rec, err := keyspace.UnmarshalEndpointRecord(kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		want := f.w.records[ep]
		if kv.Lease != int64(want.Lease) {
			t.Errorf("%v: record on lease %x, want %x", ep, kv.Lease, want.Lease)
		}
		var next chunkNext
		if err := json.Unmarshal(kv.Value, &next); err != nil {
			t.Fatal(err)
		}
		wantNext := map[string]uint64{}
		wantShards := map[string][]keyspace.LeaseShard{}
		for _, tr := range tier.All {
			et := epTier{ep, tr}
			if n := len(f.w.blocks[et]); n > 0 {
				wantNext[tr.String()] = uint64((n + keyspace.DefaultChunkSize - 1) / keyspace.DefaultChunkSize)
			}
			for _, s := range want.TierLeases[tr.String()] {
				var chunks int
				for b, id := range leases {
					if b.epTier == et && id == clientv3.LeaseID(s.ID) {
						chunks++
					}
				}
				wantShards[tr.String()] = append(wantShards[tr.String()], keyspace.LeaseShard{ID: s.ID, Keys: chunks})
			}
		}
		if diff := cmp.Diff(wantNext, next.ChunkNext); diff != "" {
			t.Errorf("%v: chunk_next (-want +got):\n%s", ep, diff)
		}
		if diff := cmp.Diff(wantShards, rec.TierLeases); diff != "" {
			t.Errorf("%v: tier_leases (-want +got):\n%s", ep, diff)
		}
		// chunk_next and tier_leases are checked above; the rest is copied.
		rec.TierLeases, want.TierLeases = nil, nil
		rec.ChunkNext, want.ChunkNext = nil, nil
		if diff := cmp.Diff(want, rec); diff != "" {
			t.Errorf("%v: record (-v1 +v2):\n%s", ep, diff)
		}
	}

	// Lease TTLs: the v2 keys' leases are the v1 ones, their TTLs as they
	// were (within the seconds the test took).
	for b, id := range leases {
		ttl, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.GrantedTTL != leaseTTL || ttl.TTL < leaseTTL-60 || ttl.TTL > leaseTTL {
			t.Errorf("%v: lease %x TTL %d of %d granted, want about %d", b, id, ttl.TTL, ttl.GrantedTTL, leaseTTL)
		}
	}

	// Offsets, owners and members as they were.
	for _, pair := range [][2]string{
		{"offsets/kvindex-events/0", "1234"}, {"offsets/kvindex-events/1", "99"},
		{"owners/kvindex-events/0", `{"member_id":"m-1","generation":3,"nonce":"n","claimed":"2026-12-01T12:00:00Z"}`},
	} {
		resp, err := cli.Get(ctx, keyspace.DefaultPrefix+pair[0])
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != pair[1] {
			t.Errorf("%s: %v %v, want %q", pair[0], resp, err, pair[1])
		}
	}
	for _, ep := range f.eps {
		rec := f.w.records[ep]
		key := keyspace.Default().MemberKey(keyspace.Partition{Topic: rec.Topic, Partition: rec.Partition}, ep)
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(rec.Lease) {
			t.Errorf("member %s: %v %v", key, resp, err)
		}
	}

	// Again: nothing to do, and etcd's revision does not move.
	before, _ := cli.Get(ctx, "x")
	rep, err = f.run(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := cli.Get(ctx, "x")
	if rep.Puts != 0 || rep.Deletes != 0 || rep.Transactions != 0 || rep.Unchanged == 0 || after.Header.Revision != before.Header.Revision {
		t.Fatalf("second run: %+v, revision %d → %d", rep, before.Header.Revision, after.Header.Revision)
	}
}

// TestMigrateConverges: a v2 keyspace that differs from the conversion
// (a chunk lost, a stray chunk, a wrong record, an endpoint that expired
// since the last run) is brought back to it, and a dry run says so
// without writing.
func TestMigrateConverges(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.etcd.Client
	if _, err := f.run(t, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := v2Index(t, cli, keyspace.Default(), keyspace.DefaultChunkSize)
	ks := keyspace.Default()
	if _, err := cli.Delete(ctx, ks.ChunkKey(f.eps[0], tier.GPU, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, ks.ChunkKey(f.eps[0], tier.GPU, 9), string(keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 1, Engine: 1}}, false))); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, ks.EndpointKey(f.eps[1]), "{}"); err != nil {
		t.Fatal(err)
	}
	// The third endpoint expires: its record lease and tier leases go,
	// and with them its v1 and v2 keys (the same leases). Its v2 record
	// is then written back as a leftover without a lease.
	rec := f.w.records[f.eps[2]]
	leftover, err := cli.Get(ctx, ks.EndpointKey(f.eps[2]))
	if err != nil || len(leftover.Kvs) != 1 {
		t.Fatal(err)
	}
	for _, id := range append([]keyspace.LeaseID{rec.Lease}, shardIDs(rec)...) {
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, ks.EndpointKey(f.eps[2]), string(leftover.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	for _, tr := range tier.All {
		delete(want, epTier{f.eps[2], tr})
	}

	before, _ := cli.Get(ctx, "x")
	rep, err := f.run(t, func(c *Config) { c.DryRun = true })
	if err != nil {
		t.Fatal(err)
	}
	after, _ := cli.Get(ctx, "x")
	// Puts: the lost chunk and the wrong record; deletes: the stray chunk
	// and the expired endpoint's record.
	if !rep.DryRun || rep.Puts != 2 || rep.Deletes != 2 || rep.Transactions == 0 || after.Header.Revision != before.Header.Revision {
		t.Fatalf("dry run: %+v, revision %d → %d", rep, before.Header.Revision, after.Header.Revision)
	}
	if rep, err = f.run(t, nil); err != nil || rep.Puts != 2 || rep.Deletes != 2 {
		t.Fatalf("run: %+v %v", rep, err)
	}
	got, _ := v2Index(t, cli, ks, keyspace.DefaultChunkSize)
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(epTier{})); diff != "" {
		t.Fatalf("v2 index (-want +got):\n%s", diff)
	}
	if resp, _ := cli.Get(ctx, ks.EndpointKey(f.eps[2])); len(resp.Kvs) != 0 {
		t.Fatal("the expired endpoint's v2 record was kept")
	}
	if rep, err = f.run(t, nil); err != nil || rep.Puts != 0 || rep.Deletes != 0 {
		t.Fatalf("third run: %+v %v", rep, err)
	}
}

func shardIDs(rec keyspace.EndpointRecord) []keyspace.LeaseID {
	var out []keyspace.LeaseID
	for _, s := range rec.TierLeases {
		for _, sh := range s {
			out = append(out, sh.ID)
		}
	}
	return out
}

func TestMigrateRefuses(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.etcd.Client
	ks := keyspace.Default()
	for _, prefix := range []string{V1Prefix, keyspace.DefaultPrefix} {
		t.Run("ingester_under_"+strings.Trim(prefix, "/"), func(t *testing.T) {
			lease, err := cli.Grant(ctx, 30)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Put(ctx, prefix+"ingesters/ing-1", "{}", clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			before, _ := cli.Get(ctx, "x")
			_, err = f.run(t, nil)
			// Its lease is named: before, a keys-only read left the lease
			// out and the key read as "on no lease".
			if !errors.Is(err, ErrIngesterAlive) || !strings.Contains(err.Error(), "ing-1") || !strings.Contains(err.Error(), fmt.Sprintf("lease %x", int64(lease.ID))) {
				t.Fatalf("Run = %v, want ErrIngesterAlive naming the key and its lease", err)
			}
			if after, _ := cli.Get(ctx, "x"); after.Header.Revision != before.Header.Revision {
				t.Fatal("a refused migration wrote")
			}
			if _, err := cli.Revoke(ctx, lease.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("guard", func(t *testing.T) {
		// An ingester that starts while the migration writes: the next
		// transaction's guard refuses.
		b := &batcher{kv: cli, maxOps: 8, maxBytes: 1 << 20, guards: []clientv3.Cmp{noKeys(V1Prefix + "ingesters/"), noKeys(ks.IngestersPrefix())}}
		if err := b.put(ctx, ks.Prefix()+"probe", "v", 0); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, V1Prefix+"ingesters/late", "{}"); err != nil {
			t.Fatal(err)
		}
		if err := b.flush(ctx); !errors.Is(err, ErrIngesterAlive) {
			t.Fatalf("flush = %v, want ErrIngesterAlive", err)
		}
		if resp, _ := cli.Get(ctx, ks.Prefix()+"probe"); len(resp.Kvs) != 0 {
			t.Fatal("the guarded put was applied")
		}
		if _, err := cli.Delete(ctx, V1Prefix+"ingesters/late"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("v2_ahead", func(t *testing.T) {
		if _, err := f.run(t, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, ks.OffsetKey(keyspace.Partition{Topic: "kvindex-events", Partition: 1}), "100"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.run(t, nil); !errors.Is(err, ErrV2Ahead) {
			t.Fatalf("Run = %v, want ErrV2Ahead", err)
		}
	})
	t.Run("config", func(t *testing.T) {
		for _, change := range []func(*Config){
			func(c *Config) { c.To = c.From },
			func(c *Config) { c.ChunkSize = keyspace.MaxChunkEntries + 1 },
			func(c *Config) { c.MaxTxnOps = guardOps },
			func(c *Config) { c.PageSize = 0 },
		} {
			if _, err := f.run(t, change); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Run = %v, want ErrInvalidConfig", err)
			}
		}
	})
}

// TestMigrateLeaseUnderASecond: a lease with less than a second left is
// live (etcd rounds the remaining TTL down to 0 s), so the run migrates
// its keys, or, if it expires meanwhile, reads again once etcd has
// deleted them, and succeeds either way. Before, TTL 0 counted as gone
// and the five attempts, one right after the other, all failed on it.
func TestMigrateLeaseUnderASecond(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.etcd.Client
	lease, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	w := f.w
	ep := keyspace.Endpoint{Model: "m", Pod: "short", Rank: 0}
	w.endpoint(ep, keyspace.HashModeEngine, 0, map[tier.Tier]int{tier.GPU: 3}, 100)
	// Move the endpoint's record and blocks onto the short lease.
	resp, err := cli.Get(ctx, V1Prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/short/") {
			if _, err := cli.Put(ctx, string(kv.Key), string(kv.Value), clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(testutil.Timeout(10 * time.Second))
	for {
		ttl, err := cli.TimeToLive(ctx, lease.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL == 0 {
			break
		}
		if ttl.TTL < 0 || time.Now().After(deadline) {
			t.Fatalf("lease TTL %d: never seen under a second", ttl.TTL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep, err := f.run(t, nil)
	if err != nil {
		t.Fatalf("Run with a lease under a second left = %v, want success", err)
	}
	if rep.Endpoints < len(f.eps) {
		t.Errorf("endpoints migrated = %d, want at least the fixture's %d", rep.Endpoints, len(f.eps))
	}
}

// TestMigrateCallTimeout: an etcd that stops answering mid-run fails the
// run after CallTimeout instead of holding it forever (a paused proxy
// keeps the connection open and answers nothing, as a SIGSTOPped etcd
// does). Before, only the first reachability check had a deadline.
func TestMigrateCallTimeout(t *testing.T) {
	f := newFixture(t)
	px := testutil.StartProxy(t, testutil.HostPort(f.etcd.Endpoints[0]))
	cli, err := testutil.NewEtcdClient([]string{px.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	px.Pause()
	defer px.Resume()
	done := make(chan error, 1)
	go func() {
		cfg := DefaultConfig()
		cfg.Etcd, cfg.CallTimeout = cli, 300*time.Millisecond
		_, err := Run(context.Background(), cfg)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run against an etcd that does not answer = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(testutil.Timeout(30 * time.Second)):
		t.Fatal("Run still waiting on an etcd that does not answer")
	}
}

// TestMigrateMalformedOffsetTwice: a v1 offset migrate cannot parse is
// copied as it is (the v2 ingester reads it as out of range), and a second
// run accepts the copy it made: before, it refused it as "not one migrate
// wrote".
func TestMigrateMalformedOffsetTwice(t *testing.T) {
	f := newFixture(t)
	if _, err := f.etcd.Client.Put(context.Background(), V1Prefix+"offsets/kvindex-events/2", "abc"); err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ {
		rep, err := f.run(t, nil)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if run == 2 && rep.Puts+rep.Deletes != 0 {
			t.Errorf("run 2 wrote %d puts and %d deletes, want none", rep.Puts, rep.Deletes)
		}
	}
}

// TestMigrateChunkOfALeaselessFirstBlock: a chunk whose first v1 block is
// on no lease (a key put by hand) takes the lease of the first of its
// blocks that has one, so it still expires with its endpoint. Before, it
// was put on no lease.
func TestMigrateChunkOfALeaselessFirstBlock(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.etcd.Client
	prefix := fmt.Sprintf("%sblocks/%s/%s/%d/gpu/", V1Prefix, url.PathEscape(f.eps[2].Model), url.PathEscape(f.eps[2].Pod), f.eps[2].Rank)
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) < 2 {
		t.Fatalf("gpu blocks of %v: %v, %d keys", f.eps[2], err, len(resp.Kvs))
	}
	// The blocks first stored (one window: one create revision) go on no
	// lease; a put keeps a key's create revision, so they stay first.
	first := resp.Kvs[0].CreateRevision
	for _, kv := range resp.Kvs {
		first = min(first, kv.CreateRevision)
	}
	for _, kv := range resp.Kvs {
		if kv.CreateRevision == first {
			if _, err := cli.Put(ctx, string(kv.Key), string(kv.Value)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.run(t, nil); err != nil {
		t.Fatal(err)
	}
	chunk, err := cli.Get(ctx, keyspace.Default().ChunkKey(f.eps[2], tier.GPU, 0))
	if err != nil || len(chunk.Kvs) != 1 {
		t.Fatalf("v2 chunk 0: %v, %d keys", err, len(chunk.Kvs))
	}
	if chunk.Kvs[0].Lease == 0 {
		t.Fatal("the chunk of a leaseless first block is on no lease: it would never expire")
	}
}

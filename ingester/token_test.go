package ingester

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

const tokenModel = "org/token-model"

// tokenPod is a test engine behind one pod: it numbers its batch records.
type tokenPod struct {
	pod string
	seq uint64
	ts  float64
}

// batch is the pod's next batch record of evs.
func (p *tokenPod) batch(t *testing.T, evs ...events.Event) refmodel.Record {
	t.Helper()
	p.ts += 0.5
	v, err := events.Encode(events.Batch{TS: 1.7e9 + p.ts, Events: evs}, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	r := refmodel.Record{Key: p.pod, Headers: map[string]string{"model": tokenModel, "seq": strconv.FormatUint(p.seq, 10)}, Value: v, Time: time.Now()}
	p.seq++
	return r
}

// stored is a BlockStored of hashes with block size bs; parent 0 means
// none.
func stored(hashes []uint64, parent uint64, tokens []int64, bs uint32, medium string) events.Event {
	return events.Event{Type: events.BlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: bs, Medium: medium}
}

func removed(hashes []uint64, medium string) events.Event {
	return events.Event{Type: events.BlockRemoved, BlockHashes: hashes, Medium: medium}
}

func tokenIDs(n int, from int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + int64(i)
	}
	return out
}

func u32(ids []int64) []uint32 {
	out := make([]uint32, len(ids))
	for i, t := range ids {
		out[i] = uint32(t)
	}
	return out
}

// tokenRun is one token-mode ingester on its own topic and prefix.
type tokenRun struct {
	e     *env
	cfg   Config
	reg   *prometheus.Registry
	r     *running
	topic string
	seen  ingesttest.Offsets
}

func startToken(t *testing.T, e *env, topic, prefix string, change func(*Config)) *tokenRun {
	t.Helper()
	cfg := e.config(t, topic, "g-"+topic, prefix)
	cfg.HashMode = keyspace.HashModeToken
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	if change != nil {
		change(&cfg)
	}
	return &tokenRun{e: e, cfg: cfg, reg: reg, r: start(t, cfg), topic: topic, seen: ingesttest.Offsets{}}
}

// send produces recs and waits until the ingester applied them.
func (tr *tokenRun) send(t *testing.T, ctx context.Context, recs ...refmodel.Record) {
	t.Helper()
	tr.seen.Merge(ingesttest.Produce(t, ctx, tr.e.prod, tr.topic, recs))
	ingesttest.WaitApplied(t, ctx, tr.e.etcd.Client, tr.cfg.Keyspace, tr.topic, tr.seen)
}

// blockValues maps each block (endpoint pod, tier, key) to its engine
// hash, as its chunk entry holds it (hex16).
func blockValues(t *testing.T, ctx context.Context, cli *clientv3.Client, ks keyspace.Keyspace) map[keyspace.Block]string {
	t.Helper()
	out := map[keyspace.Block]string{}
	for _, c := range ingesttest.Chunks(t, ctx, cli, ks) {
		for _, e := range c.Entries {
			out[keyspace.Block{Endpoint: c.Endpoint, Tier: c.Tier, Hash: e.Key}] = hex16(e.Engine)
		}
	}
	return out
}

// chunkValue encodes a token-mode chunk of (key, engine hash) pairs.
func chunkValue(pairs ...uint64) string {
	var es []keyspace.ChunkEntry
	for i := 0; i+1 < len(pairs); i += 2 {
		es = append(es, keyspace.ChunkEntry{Key: pairs[i], Engine: pairs[i+1]})
	}
	return string(keyspace.AppendChunkValue(nil, es, true))
}

func block(pod string, tr tier.Tier, key uint64) keyspace.Block {
	return keyspace.Block{Endpoint: keyspace.Endpoint{Model: tokenModel, Pod: pod}, Tier: tr, Hash: key}
}

func hex16(h uint64) string { return fmt.Sprintf("%016x", h) }

// TestTokenModeSamePromptAcrossPods: two engines hash one prompt
// differently (an unset PYTHONHASHSEED); in token mode both pods hold the
// same canonical keys, each valued with the pod's own engine hash, and the
// records say token mode.
func TestTokenModeSamePromptAcrossPods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 2, []string{"tok-pods"})
	tr := startToken(t, e, "tok-pods", "/kvindex/tok-pods/", nil)
	toks := tokenIDs(8, 100)
	a, b := &tokenPod{pod: "a"}, &tokenPod{pod: "b"}
	tr.send(t, ctx,
		a.batch(t, stored([]uint64{0xa1, 0xa2}, 0, toks, 4, "GPU")),
		b.batch(t, stored([]uint64{0xb1, 0xb2}, 0, toks, 4, "GPU")),
	)
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks)}, 4)
	want := map[keyspace.Block]string{
		block("a", tier.GPU, keys[0]): hex16(0xa1), block("a", tier.GPU, keys[1]): hex16(0xa2),
		block("b", tier.GPU, keys[0]): hex16(0xb1), block("b", tier.GPU, keys[1]): hex16(0xb2),
	}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
	for id, rec := range ingesttest.Endpoints(t, ctx, e.etcd.Client, tr.cfg.Keyspace) {
		if rec.HashMode != keyspace.HashModeToken {
			t.Errorf("%s: record hash_mode %q, want token", id, rec.HashMode)
		}
	}
}

// TestTokenModeLifetime walks one endpoint through the map's lifetime:
// placeholders take their engine hash's key, an entry lives while any tier
// holds its block, unknown placeholders, orphans and bad tokens are
// skipped and counted, removals of unknown hashes are no-ops, and a clear
// forgets every entry.
func TestTokenModeLifetime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-life"})
	tr := startToken(t, e, "tok-life", "/kvindex/tok-life/", nil)
	p := &tokenPod{pod: "p"}
	toks := tokenIDs(12, 7)
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks)}, 4)
	ks := tr.cfg.Keyspace
	check := func(step string, want map[keyspace.Block]string) {
		t.Helper()
		if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, ks), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: blocks (-want +got):\n%s", step, diff)
		}
	}

	tr.send(t, ctx,
		p.batch(t,
			stored([]uint64{1, 2}, 0, toks[:8], 4, "GPU"),
			stored([]uint64{3}, 2, toks[8:], 4, "GPU"),       // chained on block 2 of an earlier event
			stored([]uint64{2, 9}, 0, nil, 0, "CPU"),         // placeholders: 2 known, 9 unknown
			stored([]uint64{20, 21}, 77, toks[:8], 4, "GPU"), // orphan: parent 77 unknown
			stored([]uint64{30}, 0, toks[:3], 4, "GPU"),      // 3 tokens for a block of 4
		))
	check("stores", map[keyspace.Block]string{
		block("p", tier.GPU, keys[0]): hex16(1), block("p", tier.GPU, keys[1]): hex16(2), block("p", tier.GPU, keys[2]): hex16(3),
		block("p", tier.CPU, keys[1]): hex16(2),
	})

	tr.send(t, ctx, p.batch(t,
		removed([]uint64{2}, "GPU"),            // still on cpu: the entry lives
		removed([]uint64{1, 555}, "GPU"),       // 555 unknown: a no-op
		stored([]uint64{2}, 0, nil, 0, "DISK"), // so a placeholder still finds it
	))
	check("removals", map[keyspace.Block]string{
		block("p", tier.GPU, keys[2]): hex16(3),
		block("p", tier.CPU, keys[1]): hex16(2), block("p", tier.Disk, keys[1]): hex16(2),
	})

	tr.send(t, ctx, p.batch(t,
		removed([]uint64{2}, "CPU"), removed([]uint64{2}, "DISK"), // gone from every tier
		stored([]uint64{2}, 0, nil, 0, "CPU"), // so the placeholder is unknown now
	))
	check("entry_gone", map[keyspace.Block]string{block("p", tier.GPU, keys[2]): hex16(3)})

	tr.send(t, ctx, p.batch(t,
		events.Event{Type: events.AllBlocksCleared},
		stored([]uint64{3}, 0, nil, 0, "CPU"), // the clear forgot 3
	))
	check("clear", nil)

	counts := map[string]float64{}
	for _, r := range []string{unkeyedPlaceholder, unkeyedParent, unkeyedTokens, unknownRemoval} {
		counts[r] = promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(r))
	}
	want := map[string]float64{unkeyedPlaceholder: 3, unkeyedParent: 2, unkeyedTokens: 1, unknownRemoval: 1}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("unkeyed blocks by reason (-want +got):\n%s", diff)
	}
}

// TestTokenModeExtras: a block's extras are its extra_keys entry when the
// event has extra_keys, else its LoRA name; keys match what a router
// computes for the same request with client.TokenKeys.
func TestTokenModeExtras(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-extra"})
	tr := startToken(t, e, "tok-extra", "/kvindex/tok-extra/", nil)
	toks := tokenIDs(8, 40)
	lora := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks), LoRAName: "sql"}, 4)
	salted := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks), LoRAName: "sql", CacheSalt: "tenant-1"}, 4)
	str := func(s string) events.Extra { return events.Extra{Kind: events.ExtraString, Data: []byte(s)} }

	byName := stored([]uint64{1, 2}, 0, toks, 4, "GPU")
	byName.LoraName = "sql"
	byKeys := stored([]uint64{3, 4}, 0, toks, 4, "GPU")
	byKeys.LoraName = "sql" // ignored: extra_keys rule
	byKeys.HasExtraKeys, byKeys.ExtraKeysLen = true, 2
	byKeys.ExtraKeys = [][]events.Extra{{str("sql"), str("tenant-1")}, {str("sql")}}
	badKeys := stored([]uint64{5}, 0, toks[:4], 4, "GPU")
	badKeys.HasExtraKeys, badKeys.ExtraKeysLen = true, 2 // not one per block

	a, b := &tokenPod{pod: "a"}, &tokenPod{pod: "b"}
	tr.send(t, ctx, a.batch(t, byName), b.batch(t, byKeys, badKeys))
	want := map[keyspace.Block]string{
		block("a", tier.GPU, lora[0]): hex16(1), block("a", tier.GPU, lora[1]): hex16(2),
		block("b", tier.GPU, salted[0]): hex16(3), block("b", tier.GPU, salted[1]): hex16(4),
	}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("blocks (-want +got):\n%s", diff)
	}
	if got := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(unkeyedExtras)); got != 1 {
		t.Errorf("unkeyed blocks for bad extra_keys = %v, want 1", got)
	}
}

// TestTokenModeRebuildOnClaim: a new owner rebuilds the map from the block
// values before it applies anything, so removals and placeholders of
// blocks stored under the previous owner reach their keys.
func TestTokenModeRebuildOnClaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-claim"})
	// Pages of 4 KiB hold a few dozen blocks: the rebuild pages.
	small := func(c *Config) { c.MapRebuildPageBytes = 4 << 10 }
	first := startToken(t, e, "tok-claim", "/kvindex/tok-claim/", small)
	p := &tokenPod{pod: "p"}
	const n = 120
	toks := tokenIDs(4*n, 1)
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	first.send(t, ctx, p.batch(t, stored(hashes, 0, toks, 4, "GPU")))
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks)}, 4)
	if err := first.r.stop(); err != nil {
		t.Fatal(err)
	}

	second := startToken(t, e, "tok-claim", "/kvindex/tok-claim/", small)
	second.seen = first.seen
	second.send(t, ctx, p.batch(t,
		removed(hashes[:n-1], "GPU"),                                  // only the map knows their keys
		stored([]uint64{hashes[n-1]}, 0, nil, 0, "CPU"),               // a placeholder of the last one
		stored([]uint64{5000}, hashes[n-1], tokenIDs(4, 9), 4, "GPU"), // chained on it
	))
	want := map[keyspace.Block]string{
		block("p", tier.GPU, keys[n-1]): hex16(hashes[n-1]),
		block("p", tier.CPU, keys[n-1]): hex16(hashes[n-1]),
		block("p", tier.GPU, client.TokenBlockKey(keys[n-1], u32(tokenIDs(4, 9)), nil)): hex16(5000),
	}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, second.cfg.Keyspace)); diff != "" {
		t.Errorf("blocks after the new owner's records (-want +got):\n%s", diff)
	}
	if got := promtest.ToFloat64(second.r.in.m.mapRebuilt); got != n {
		t.Errorf("entries rebuilt = %v, want %d", got, n)
	}
}

// TestRebuildPagesAtOneRevision calls the rebuild directly: it reads at
// one revision at or after the claim's, pages by bytes, rebuilds chunk
// state (sequence numbers, entries in order, leases, chunk_next) and the
// token-mode map, and marks for rewriting the chunks whose entries cannot
// be kept (a value that does not decode, the other mode's width, a key in
// two chunks, a second key of one engine hash) instead of leaving them
// unreachable.
func TestRebuildPagesAtOneRevision(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-rb"})
	ks, err := keyspace.New("/kvindex/tok-rb/")
	if err != nil {
		t.Fatal(err)
	}
	id := keyspace.Endpoint{Model: tokenModel, Pod: "p"}
	engineID := keyspace.Endpoint{Model: tokenModel, Pod: "engine-mode"}
	// Every chunk on one lease, which the endpoints' records name (a chunk
	// on none is rewritten too: TestClaimReleasesUnleasedChunks).
	lease, err := e.etcd.Client.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	put := func(id keyspace.Endpoint, tr tier.Tier, seq uint64, val string) {
		t.Helper()
		if _, err := e.etcd.Client.Put(ctx, ks.ChunkKey(id, tr, seq), val, clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	// 200 blocks in 50 gpu chunks of 4: key i+1, engine hash 0x1000+i.
	for c := range 50 {
		var pairs []uint64
		for i := 4 * c; i < 4*c+4; i++ {
			pairs = append(pairs, uint64(i+1), uint64(0x1000+i))
		}
		put(id, tier.GPU, uint64(c), chunkValue(pairs...))
	}
	put(id, tier.GPU, 50, chunkValue(1, 0x1000))                                                          // key 1 is in gpu/0 already
	put(id, tier.GPU, 51, string(keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 7}}, false))) // width 8 in token mode
	put(id, tier.CPU, 0, chunkValue(1, 0x1000, 999, 0x1001))                                              // the same block on cpu; a second key of 0x1001
	put(id, tier.Disk, 0, "not a chunk")
	put(engineID, tier.GPU, 3, string(keyspace.AppendChunkValue(nil, []keyspace.ChunkEntry{{Key: 5, Engine: 5}, {Key: 6, Engine: 6}}, false)))
	claim, err := e.etcd.Client.Put(ctx, "/kvindex/tok-rb/owners/x/0", "claim")
	if err != nil {
		t.Fatal(err)
	}

	cfg := e.config(t, "tok-rb", "g", "/kvindex/tok-rb/")
	cfg.HashMode = keyspace.HashModeToken
	cfg.MapRebuildPageBytes = 4 << 10
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	part := keyspace.Partition{Topic: "tok-rb", Partition: 0}
	ep := newEndpoint(ks, part, id)
	ep.hashMode = keyspace.HashModeToken
	engineEp := newEndpoint(ks, part, engineID)
	engineEp.hashMode = keyspace.HashModeEngine
	for _, t := range tier.All {
		ep.tiers[t] = []shard{{id: lease.ID}}
		engineEp.tiers[t] = []shard{{id: lease.ID}}
	}
	w := in.newWorker(0, claim.Header.Revision, map[keyspace.Endpoint]*endpoint{ep.id: ep, engineEp.id: engineEp})
	st, err := w.rebuild(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Revision < claim.Header.Revision {
		t.Errorf("rebuilt at revision %d, before the claim's %d", st.Revision, claim.Header.Revision)
	}
	if st.Pages < 3 {
		t.Errorf("%d pages for 55 chunks in 4 KiB pages, want several", st.Pages)
	}
	// Kept: gpu 199 (key 2 names 0x1001, mapped to 999 on cpu first:
	// keys list in key order, cpu < disk < gpu), cpu 2, engine-mode 2.
	if st.Chunks != 55 || st.Blocks != 203 || st.Entries != 200 || st.Unmapped != 4 {
		t.Errorf("rebuild stats %+v, want 55 chunks, 203 blocks, 200 entries, 4 unmapped", st)
	}
	if e, ok := ep.engine[0x1000]; !ok || e.key != 1 || e.tiers != bit(tier.GPU)|bit(tier.CPU) {
		t.Errorf("entry of 0x1000 = %+v, %v; want key 1 in gpu and cpu", e, ok)
	}
	if e, ok := ep.engine[0x1001]; !ok || e.key != 999 {
		t.Errorf("entry of 0x1001 = %+v, %v; want key 999", e, ok)
	}
	want := []chunkFix{{tier: tier.Disk, seq: 0}, {tier: tier.GPU, seq: 0}, {tier: tier.GPU, seq: 50}, {tier: tier.GPU, seq: 51}}
	if diff := cmp.Diff(want, ep.fixes, cmp.AllowUnexported(chunkFix{})); diff != "" {
		t.Errorf("chunks to rewrite (-want +got):\n%s", diff)
	}
	if got := chunkKeys(ep.chunks[tier.GPU].chunks[0]); !slices.Equal(got, []uint64{1, 3, 4}) {
		t.Errorf("gpu/0 rebuilt as %v, want [1 3 4]", got)
	}
	if n := ep.chunks[tier.GPU].next; n != 52 {
		t.Errorf("gpu chunk_next %d, want 52 (past the highest sequence found)", n)
	}
	if engineEp.engine != nil {
		t.Errorf("an engine-mode endpoint got a map: %v", engineEp.engine)
	}
	if got := chunkKeys(engineEp.chunks[tier.GPU].chunks[3]); !slices.Equal(got, []uint64{5, 6}) || !engineEp.chunks[tier.GPU].has(6) {
		t.Errorf("engine-mode gpu/3 rebuilt as %v, want [5 6]", got)
	}
}

// chunkKeys lists a chunk's key hashes in order (nil for no chunk).
func chunkKeys(c *chunk) []uint64 {
	if c == nil {
		return nil
	}
	var out []uint64
	for _, e := range c.entries {
		out = append(out, e.Key)
	}
	return out
}

// TestHashModeChangeDropsAndRewrites: an endpoint written in engine-hash
// mode, claimed by a token-mode ingester, loses its blocks and gets its
// record rewritten in token mode before any of its records apply.
func TestHashModeChangeDropsAndRewrites(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(60*time.Second))
	defer cancel()
	const topic = "tok-mode"
	e := newEnv(t, 1, []string{topic})
	cfg := e.config(t, topic, "g-"+topic, "/kvindex/tok-mode/")
	old := start(t, cfg) // engine-hash mode (the test default)
	p := &tokenPod{pod: "p"}
	seen := ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{p.batch(t, stored([]uint64{1, 2}, 0, tokenIDs(8, 1), 4, "GPU"))})
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, seen)
	if got := len(ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace)); got != 2 {
		t.Fatalf("engine-mode run wrote %d blocks, want 2", got)
	}
	if err := old.stop(); err != nil {
		t.Fatal(err)
	}

	tok := cfg
	tok.HashMode = keyspace.HashModeToken
	reg := prometheus.NewRegistry()
	tok.Registry = reg
	var logs testutil.LogBuffer
	tok.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := start(t, tok)
	id := keyspace.Endpoint{Model: tokenModel, Pod: "p"}
	ingesttest.WaitFor(t, ctx, e.etcd.Client, cfg.Keyspace.Prefix(), "the record rewritten in token mode", func() bool {
		rec, ok := ingesttest.Endpoints(t, ctx, e.etcd.Client, cfg.Keyspace)[id]
		return ok && rec.HashMode == keyspace.HashModeToken
	})
	if got := ingesttest.Blocks(t, ctx, e.etcd.Client, cfg.Keyspace); len(got) != 0 {
		t.Errorf("engine-hash blocks left after the mode change: %v", got)
	}
	if got := promtest.ToFloat64(r.in.m.drops.WithLabelValues("hash_mode")); got != 1 {
		t.Errorf("hash_mode drops = %v, want 1", got)
	}
	// Said at WARN (standalone and most deployments log warnings only):
	// before, only an INFO line and the metric told of the lost blocks.
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "another hash mode") {
		t.Errorf("no WARN of the endpoints dropped for their hash mode; logged:\n%s", logs.String())
	}
	// Its sequence state survives: the next record applies as seq 1.
	seen.Merge(ingesttest.Produce(t, ctx, e.prod, topic, []refmodel.Record{p.batch(t, stored([]uint64{3}, 0, tokenIDs(4, 1), 4, "GPU"))}))
	ingesttest.WaitApplied(t, ctx, e.etcd.Client, cfg.Keyspace, topic, seen)
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(tokenIDs(4, 1))}, 4)
	if diff := cmp.Diff(map[keyspace.Block]string{block("p", tier.GPU, keys[0]): hex16(3)}, blockValues(t, ctx, e.etcd.Client, cfg.Keyspace)); diff != "" {
		t.Errorf("blocks after the next record (-want +got):\n%s", diff)
	}
	if got := promtest.ToFloat64(r.in.m.drops.WithLabelValues("gap")) + promtest.ToFloat64(r.in.m.drops.WithLabelValues("restart")); got != 0 {
		t.Errorf("the next record was taken for a gap or restart (%v drops)", got)
	}
}

// TestMapCapDropsLargestEndpoint: past MaxMapEntries the endpoint with the
// most entries is dropped as by resync (its record kept), never an entry
// forgotten while its block stays.
func TestMapCapDropsLargestEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-cap"})
	tr := startToken(t, e, "tok-cap", "/kvindex/tok-cap/", func(c *Config) { c.MaxMapEntries = 5 })
	a, b := &tokenPod{pod: "a"}, &tokenPod{pod: "b"}
	tr.send(t, ctx, a.batch(t, stored([]uint64{1, 2}, 0, tokenIDs(8, 1), 4, "GPU")))
	tr.send(t, ctx, b.batch(t, stored([]uint64{3, 4, 5, 6}, 0, tokenIDs(16, 1), 4, "GPU")))
	keysA := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(tokenIDs(8, 1))}, 4)
	want := map[keyspace.Block]string{block("a", tier.GPU, keysA[0]): hex16(1), block("a", tier.GPU, keysA[1]): hex16(2)}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("blocks past the cap (-want +got):\n%s", diff)
	}
	if got := promtest.ToFloat64(tr.r.in.m.drops.WithLabelValues("map_cap")); got != 1 {
		t.Errorf("map_cap drops = %v, want 1", got)
	}
	if _, ok := ingesttest.Endpoints(t, ctx, e.etcd.Client, tr.cfg.Keyspace)[keyspace.Endpoint{Model: tokenModel, Pod: "b"}]; !ok {
		t.Error("the dropped endpoint's record is gone; a resync keeps it")
	}
	// b's engine hashes are forgotten with its blocks: a placeholder of
	// one is unknown now.
	tr.send(t, ctx, b.batch(t, stored([]uint64{3}, 0, nil, 0, "CPU")))
	if got := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(unkeyedPlaceholder)); got != 1 {
		t.Errorf("unknown placeholders = %v, want 1", got)
	}
	if got := promtest.ToFloat64(tr.r.in.m.mapEntries.WithLabelValues("0")); got != 2 {
		t.Errorf("map_entries = %v, want 2", got)
	}
}

// TestTokenModeTierClearAndGroupChange: a tier clear forgets the entries
// only that tier held (a placeholder of one is unknown afterwards) and
// keeps the others; the switch from provisional group 0 to an attention
// group drops the endpoint's blocks and its whole map.
func TestTokenModeTierClearAndGroupChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-tier"})
	tr := startToken(t, e, "tok-tier", "/kvindex/tok-tier/", nil)
	p := &tokenPod{pod: "p"}
	toks := tokenIDs(8, 3)
	keys := client.TokenKeys(client.TokenPrompt{TokenIDs: u32(toks)}, 4)
	tr.send(t, ctx, p.batch(t,
		stored([]uint64{1, 2}, 0, toks, 4, "GPU"),
		stored([]uint64{2}, 0, nil, 0, "CPU"),
		events.Event{Type: events.TierBlocksCleared, Medium: "GPU"},
		stored([]uint64{1, 2}, 0, nil, 0, "DISK"), // 1 only gpu held: unknown now; 2 lives on cpu
	))
	want := map[keyspace.Block]string{block("p", tier.CPU, keys[1]): hex16(2), block("p", tier.Disk, keys[1]): hex16(2)}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("after the tier clear (-want +got):\n%s", diff)
	}
	if got := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(unkeyedPlaceholder)); got != 1 {
		t.Errorf("unknown placeholders = %v, want 1", got)
	}

	attention := stored([]uint64{9}, 0, toks[:4], 4, "GPU")
	attention.GroupIdx, attention.KVCacheSpecKind = 3, events.KindFullAttention
	tr.send(t, ctx, p.batch(t, attention))
	// The group change dropped group 0's blocks (their map entries with
	// them, applier.drop): only the attention group's block is left.
	want = map[keyspace.Block]string{block("p", tier.GPU, keys[0]): hex16(9)}
	if diff := cmp.Diff(want, blockValues(t, ctx, e.etcd.Client, tr.cfg.Keyspace)); diff != "" {
		t.Errorf("after the group change (-want +got):\n%s", diff)
	}
}

// TestRebuildAtStoredOffset: the rebuild reads the chunks as of the
// stored offset's revision, not what a window that crashed before its
// last transaction wrote after it (a chunk rewritten, a chunk opened), so
// the replay's decisions see the state the records before the stored
// offset made, and it marks those leftovers to be written back; when that
// revision is compacted it falls back to the newest one.
func TestRebuildAtStoredOffset(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-off"})
	ks, err := keyspace.New("/kvindex/tok-off/")
	if err != nil {
		t.Fatal(err)
	}
	id := keyspace.Endpoint{Model: tokenModel, Pod: "p"}
	chunkKey := func(seq uint64) string { return ks.ChunkKey(id, tier.GPU, seq) }
	// The chunks on a lease the endpoint's record names (one on none is
	// rewritten as well: TestClaimReleasesUnleasedChunks).
	lease, err := e.etcd.Client.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	onLease := clientv3.WithLease(lease.ID)
	if _, err := e.etcd.Client.Put(ctx, chunkKey(0), chunkValue(1, 0x1001, 2, 0x1002), onLease); err != nil {
		t.Fatal(err)
	}
	part := keyspace.Partition{Topic: "tok-off", Partition: 0}
	off, err := e.etcd.Client.Put(ctx, ks.OffsetKey(part), keyspace.FormatOffset(7))
	if err != nil {
		t.Fatal(err)
	}
	// The uncommitted window: key 1 removed, key 3 stored, then the crash.
	if _, err := e.etcd.Client.Put(ctx, chunkKey(0), chunkValue(2, 0x1002, 3, 0x1003), onLease); err != nil {
		t.Fatal(err)
	}
	if _, err := e.etcd.Client.Put(ctx, chunkKey(1), chunkValue(4, 0x1004), onLease); err != nil {
		t.Fatal(err)
	}
	claim, err := e.etcd.Client.Put(ctx, ks.OwnerKey(part), "claim")
	if err != nil {
		t.Fatal(err)
	}

	cfg := e.config(t, "tok-off", "g", "/kvindex/tok-off/")
	cfg.HashMode = keyspace.HashModeToken
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rebuild := func() (*endpoint, rebuildStats) {
		t.Helper()
		ep := newEndpoint(ks, part, id)
		ep.hashMode = keyspace.HashModeToken
		ep.chunks[tier.GPU].next = 1 // the record's chunk_next as of the offset
		ep.tiers[tier.GPU] = []shard{{id: lease.ID}}
		w := in.newWorker(0, claim.Header.Revision, map[keyspace.Endpoint]*endpoint{ep.id: ep})
		w.offsetRev = off.Header.Revision
		st, err := w.rebuild(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ep, st
	}
	keys := func(ep *endpoint) map[uint64]uint64 {
		got := map[uint64]uint64{}
		for h, en := range ep.engine {
			got[h] = en.key
		}
		return got
	}

	ep, st := rebuild()
	if st.Revision != off.Header.Revision || st.Latest {
		t.Errorf("rebuilt at revision %d (latest %v), want the stored offset's %d", st.Revision, st.Latest, off.Header.Revision)
	}
	if diff := cmp.Diff(map[uint64]uint64{0x1001: 1, 0x1002: 2}, keys(ep)); diff != "" {
		t.Errorf("map as of the stored offset (-want +got):\n%s", diff)
	}
	if got := chunkKeys(ep.chunks[tier.GPU].chunks[0]); !slices.Equal(got, []uint64{1, 2}) || ep.chunks[tier.GPU].next != 1 {
		t.Errorf("gpu/0 as of the stored offset = %v, chunk_next %d; want [1 2], 1", got, ep.chunks[tier.GPU].next)
	}
	// What the crashed window left (gpu/0 rewritten, gpu/1 opened) is
	// written back before the first record: gpu/0 as of the offset, gpu/1
	// deleted.
	want := []chunkFix{{tier: tier.GPU, seq: 0}, {tier: tier.GPU, seq: 1}}
	if diff := cmp.Diff(want, ep.fixes, cmp.AllowUnexported(chunkFix{})); diff != "" || st.Leftovers != 2 {
		t.Errorf("leftovers %d (-want +got):\n%s", st.Leftovers, diff)
	}

	if _, err := e.etcd.Client.Compact(ctx, claim.Header.Revision); err != nil {
		t.Fatal(err)
	}
	ep, st = rebuild()
	if !st.Latest || st.Revision < claim.Header.Revision {
		t.Errorf("after compaction rebuilt at revision %d (latest %v), want the newest", st.Revision, st.Latest)
	}
	if diff := cmp.Diff(map[uint64]uint64{0x1002: 2, 0x1003: 3, 0x1004: 4}, keys(ep)); diff != "" {
		t.Errorf("map at the newest revision (-want +got):\n%s", diff)
	}
	if n := ep.chunks[tier.GPU].next; n != 2 {
		t.Errorf("chunk_next at the newest revision %d, want 2", n)
	}
}

// TestTokenModeBlockSizeFromKeyedStores: the endpoint's block size comes
// only from stores whose token ids keyed a block at it. A store skipped
// as unkeyable (3 tokens for a block of 999) leaves the size, so the
// endpoint's blocks still match a token Lookup at it, and a placeholder
// (no token ids) names no size either.
func TestTokenModeBlockSizeFromKeyedStores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	e := newEnv(t, 1, []string{"tok-size"})
	tr := startToken(t, e, "tok-size", "/kvindex/tok-size/", nil)
	p := &tokenPod{pod: "p"}
	toks := tokenIDs(12, 7)
	blockSize := func(step string, want uint32) {
		t.Helper()
		rec, ok := ingesttest.Endpoints(t, ctx, e.etcd.Client, tr.cfg.Keyspace)[keyspace.Endpoint{Model: tokenModel, Pod: "p"}]
		if !ok {
			t.Fatalf("%s: no endpoint record", step)
		}
		if rec.BlockSize != want {
			t.Errorf("%s: block size %d, want %d", step, rec.BlockSize, want)
		}
	}
	tr.send(t, ctx, p.batch(t, stored([]uint64{1, 2}, 0, toks[:8], 4, "GPU")))
	blockSize("keyed", 4)
	tr.send(t, ctx, p.batch(t,
		stored([]uint64{4}, 2, toks[:5], 5, "GPU"),   // 5 tokens, 1 block of 5, chained on 2: keyed
		stored([]uint64{3}, 0, toks[:3], 999, "GPU"), // 3 tokens for a block of 999
		stored([]uint64{1}, 0, nil, 7, "CPU"),        // a placeholder naming 7
	))
	blockSize("keyed at 5, then two that name other sizes", 5)
	tr.send(t, ctx, p.batch(t, stored([]uint64{5}, 0, toks[:3], 999, "GPU")))
	blockSize("unkeyable", 5)
	if got := promtest.ToFloat64(tr.r.in.m.unkeyedBlocks.WithLabelValues(unkeyedTokens)); got != 2 {
		t.Errorf("unkeyed blocks for bad tokens = %v, want 2", got)
	}
}

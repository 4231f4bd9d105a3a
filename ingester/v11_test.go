package ingester

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tier"
)

// TestV11StateAcrossRestarts checks the DESIGN v1.1 state an endpoint
// record carries from one ingester to the next: the medium-map fingerprint
// (an endpoint written under another map, or under none as before v1.1, is
// dropped before its next record applies, and only then) and the indexed
// KV-cache group (a new owner keeps skipping the groups the old one
// skipped). After every phase etcd must hold what the reference model
// holds.
func TestV11StateAcrossRestarts(t *testing.T) {
	const topic, model = "v11", "m"
	e := newEnv(t, 1, []string{topic})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(90*time.Second))
	defer cancel()
	base := e.config(t, topic, "g-v11", "/kvindex/v11/")
	ks := base.Keyspace
	ref := refmodel.New(refmodel.Config{LivenessWindow: base.LivenessWindow})

	t0 := time.Now()
	rec := func(pod string, headers map[string]string, evs ...any) refmodel.Record {
		h := map[string]string{"model": model}
		for k, v := range headers {
			h[k] = v
		}
		r := refmodel.Record{Key: pod, Headers: h, Time: t0}
		if evs != nil {
			b, err := msgpack.Marshal(map[string]any{"ts": 1.0, "events": evs})
			if err != nil {
				t.Fatal(err)
			}
			r.Value = b
		}
		return r
	}
	st := func(medium string, group int, kind any, hs ...uint64) any {
		return map[string]any{"type": "BlockStored", "block_hashes": hs, "medium": medium, "group_idx": group, "kv_cache_spec_kind": kind}
	}
	heartbeat := map[string]string{"kind": "heartbeat"}

	// phase runs an ingester with mediums over recs and compares etcd with
	// the reference model once they are applied.
	phase := func(name string, mediums events.MediumMap, recs ...refmodel.Record) {
		t.Helper()
		cfg := base
		cfg.Mediums = mediums
		r := start(t, cfg)
		for _, x := range recs {
			ref.Apply(x)
		}
		ingesttest.WaitApplied(t, ctx, e.etcd.Client, ks, topic, ingesttest.Produce(t, ctx, e.prod, topic, recs))
		if diff := cmp.Diff(ref.Blocks(), ingesttest.Blocks(t, ctx, e.etcd.Client, ks), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: etcd blocks differ from the reference model (-model +etcd):\n%s", name, diff)
		}
		if err := r.stop(); err != nil {
			t.Fatalf("%s: stop: %v", name, err)
		}
	}
	record := func(pod string) keyspace.EndpointRecord {
		t.Helper()
		recs := ingesttest.Endpoints(t, ctx, e.etcd.Client, ks)
		r, ok := recs[keyspace.Endpoint{Model: model, Pod: pod}]
		if !ok {
			t.Fatalf("no endpoint record of %s (have %v)", pod, recs)
		}
		return r
	}

	remap := events.DefaultMediums()
	remap["CPU_TIER2"] = tier.CPU

	phase("write", nil,
		rec("a", nil, st("CPU_TIER2", 0, nil, 1), st("GPU", 0, nil, 2)),
		rec("b", nil, st("CPU_TIER2", 0, nil, 1)),
		rec("c", nil, st("CPU_TIER2", 0, nil, 1)),
		rec("old", nil, st("GPU", 0, nil, 1)),
		rec("hybrid", nil, st("GPU", 0, "mamba", 7), st("GPU", 3, "mla_attention", 8)),
	)
	if got, want := record("a").MediumMap, events.DefaultMediums().Fingerprint(); got != want {
		t.Fatalf("a's medium_map = %q, want the default map's %q", got, want)
	}
	if g := record("hybrid").AttentionGroup; g == nil || *g != 3 {
		t.Fatalf("hybrid's attention_group = %v, want 3", g)
	}

	// A record written before v1.1 has no medium_map: strip it from old's.
	oldKey := ks.EndpointKey(keyspace.Endpoint{Model: model, Pod: "old"})
	resp, err := e.etcd.Client.Get(ctx, oldKey)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("reading old's record: %v, %d", err, len(resp.Kvs))
	}
	var raw map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &raw); err != nil {
		t.Fatal(err)
	}
	delete(raw, "medium_map")
	stripped, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.etcd.Client.Put(ctx, oldKey, string(stripped), clientv3.WithLease(clientv3.LeaseID(resp.Kvs[0].Lease))); err != nil {
		t.Fatal(err)
	}
	// The reference model has no records; a pre-v1.1 endpoint's next
	// record drops it as a resync would, which is what it models.
	ref.Apply(rec("old", map[string]string{"kind": "resync"}))

	phase("same map, a pre-v1.1 record, a new owner of the hybrid endpoint", nil,
		rec("old", heartbeat),
		rec("hybrid", nil, st("GPU", 0, "full_attention", 9), st("GPU", 3, nil, 10)),
	)
	if got := record("old").MediumMap; got != events.DefaultMediums().Fingerprint() {
		t.Fatalf("old's medium_map after its heartbeat = %q, want the default map's", got)
	}

	ref.Remap(remap)
	phase("another map", remap,
		rec("a", heartbeat),
		rec("b", nil, st("CPU_TIER2", 0, nil, 3)),
	)
	if got, want := record("b").MediumMap, remap.Fingerprint(); got != want {
		t.Fatalf("b's medium_map = %q, want the new map's %q", got, want)
	}
	if got, want := record("c").MediumMap, events.DefaultMediums().Fingerprint(); got != want {
		t.Fatalf("c sent nothing, yet its medium_map = %q, want the old map's %q", got, want)
	}
}

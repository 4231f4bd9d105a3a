package keyspace

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/tier"
)

func TestDesignWorkedExample(t *testing.T) {
	ks := Default()
	ep := Endpoint{Model: "meta-llama/Llama-3.1-8B-Instruct", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 0}
	got := ks.ChunkKey(ep, tier.GPU, 0x7b05ab3397532bcc)
	want := "/kvindex/v2/chunks/meta-llama%2FLlama-3.1-8B-Instruct/team-a%2Fvllm%200@10.0.0.5:8000/0/gpu/7b05ab3397532bcc"
	if got != want {
		t.Fatalf("ChunkKey:\n got %s\nwant %s", got, want)
	}
	if got, want := ks.EndpointKey(ep), "/kvindex/v2/endpoints/meta-llama%2FLlama-3.1-8B-Instruct/team-a%2Fvllm%200@10.0.0.5:8000/0"; got != want {
		t.Fatalf("EndpointKey:\n got %s\nwant %s", got, want)
	}
}

func TestKeysRoundTrip(t *testing.T) {
	ks, err := New("/custom/prefix/")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ep   Endpoint
		tier tier.Tier
		hash uint64
	}{
		{name: "plain", ep: Endpoint{Model: "m", Pod: "vllm-0"}, tier: tier.GPU, hash: 1},
		{name: "slashes_spaces_at_colon", ep: Endpoint{Model: "Qwen/Qwen3-32B", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 7}, tier: tier.CPU, hash: math.MaxUint64},
		{name: "percent_and_unicode", ep: Endpoint{Model: "100%/模型", Pod: "pod%2F?#", Rank: math.MaxUint32}, tier: tier.Disk, hash: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := ks.ChunkKey(tc.ep, tc.tier, tc.hash)
			got, err := ks.ParseChunkKey(key)
			if err != nil {
				t.Fatalf("ParseChunkKey(%q): %v", key, err)
			}
			if diff := cmp.Diff(Chunk{Endpoint: tc.ep, Tier: tc.tier, Seq: tc.hash}, got); diff != "" {
				t.Fatalf("block key round trip (-want +got):\n%s", diff)
			}
			prefix, tr, h, err := ks.SplitChunkKey(key)
			if err != nil || prefix != ks.EndpointChunksPrefix(tc.ep) || tr != tc.tier || h != tc.hash {
				t.Fatalf("SplitChunkKey(%q) = %q, %v, %x, %v", key, prefix, tr, h, err)
			}
			if !strings.HasPrefix(key, ks.TierChunksPrefix(tc.ep, tc.tier)) || !strings.HasPrefix(key, ks.ModelChunksPrefix(tc.ep.Model)) {
				t.Fatalf("key %q is not under its tier and model prefixes", key)
			}
			if ep, err := ks.ParseEndpointChunksPrefix(prefix); err != nil || ep != tc.ep {
				t.Fatalf("ParseEndpointChunksPrefix(%q) = %v, %v", prefix, ep, err)
			}
			ekey := ks.EndpointKey(tc.ep)
			if ep, err := ks.ParseEndpointKey(ekey); err != nil || ep != tc.ep {
				t.Fatalf("ParseEndpointKey(%q) = %v, %v", ekey, ep, err)
			}
			if !strings.HasPrefix(ekey, ks.ModelEndpointsPrefix(tc.ep.Model)) {
				t.Fatalf("endpoint key %q is not under its model prefix", ekey)
			}
			if ks.KindOf(key) != KindChunk || ks.KindOf(ekey) != KindEndpoint {
				t.Fatalf("KindOf: %v %v", ks.KindOf(key), ks.KindOf(ekey))
			}
		})
	}
}

func TestPartitionKeysRoundTrip(t *testing.T) {
	ks := Default()
	p := Partition{Topic: "kvindex-events", Partition: 11}
	if got, want := ks.OffsetKey(p), "/kvindex/v2/offsets/kvindex-events/11"; got != want {
		t.Fatalf("OffsetKey = %q, want %q", got, want)
	}
	if got, want := ks.OwnerKey(p), "/kvindex/v2/owners/kvindex-events/11"; got != want {
		t.Fatalf("OwnerKey = %q, want %q", got, want)
	}
	for _, key := range []string{ks.OffsetKey(p)} {
		got, err := ks.ParseOffsetKey(key)
		if err != nil || got != p {
			t.Fatalf("ParseOffsetKey(%q) = %v, %v", key, got, err)
		}
	}
	got, err := ks.ParseOwnerKey(ks.OwnerKey(p))
	if err != nil || got != p {
		t.Fatalf("ParseOwnerKey = %v, %v", got, err)
	}
	id, err := ks.ParseIngesterKey(ks.IngesterKey("host-1/abc"))
	if err != nil || id != "host-1/abc" {
		t.Fatalf("ParseIngesterKey = %q, %v", id, err)
	}
	if ks.KindOf(ks.OffsetKey(p)) != KindOffset || ks.KindOf(ks.OwnerKey(p)) != KindOwner || ks.KindOf(ks.IngesterKey("x")) != KindIngester {
		t.Fatal("KindOf misclassifies partition or ingester keys")
	}
}

func TestParseRejectsMalformedKeys(t *testing.T) {
	ks := Default()
	block := []string{
		"/other/chunks/m/p/0/gpu/0000000000000001",
		"/kvindex/v2/chunks/m/p/0/gpu/000000000000001",   // 15 digits
		"/kvindex/v2/chunks/m/p/0/gpu/000000000000000G",  // not hex
		"/kvindex/v2/chunks/m/p/0/gpu/00000000000000AB",  // upper case
		"/kvindex/v2/chunks/m/p/0/hbm/0000000000000001",  // unknown tier
		"/kvindex/v2/chunks/m/p/01/gpu/0000000000000001", // leading zero
		"/kvindex/v2/chunks/m/p/-1/gpu/0000000000000001",
		"/kvindex/v2/chunks/m/p/4294967296/gpu/0000000000000001", // rank overflow
		"/kvindex/v2/chunks/m/0/gpu/0000000000000001",            // missing pod
		"/kvindex/v2/chunks/m/a/b/0/gpu/0000000000000001",        // extra segment
		"/kvindex/v2/chunks/m//0/gpu/0000000000000001",           // empty pod
		"/kvindex/v2/chunks/%6D/p/0/gpu/0000000000000001",        // non-canonical escape of "m"
		"/kvindex/v2/chunks/m/p%zz/0/gpu/0000000000000001",       // bad escape
		"/kvindex/v2/chunks/m/%FF/0/gpu/0000000000000001",        // not UTF-8
		"/kvindex/v2/endpoints/m/p/0",
	}
	for _, key := range block {
		if _, err := ks.ParseChunkKey(key); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseChunkKey(%q) error = %v, want ErrMalformedKey", key, err)
		}
	}
	endpoint := []string{
		"/kvindex/v2/endpoints/m/p",
		"/kvindex/v2/endpoints/m/p/0/x",
		"/kvindex/v2/endpoints/m/p/x",
		"/kvindex/v2/chunks/m/p/0",
	}
	for _, key := range endpoint {
		if _, err := ks.ParseEndpointKey(key); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseEndpointKey(%q) error = %v, want ErrMalformedKey", key, err)
		}
	}
	partition := []string{
		"/kvindex/v2/offsets/t",
		"/kvindex/v2/offsets/t/-1",
		"/kvindex/v2/offsets/t/2147483648",
		"/kvindex/v2/offsets/t/1/2",
		"/kvindex/v2/offsets//1",
	}
	for _, key := range partition {
		if _, err := ks.ParseOffsetKey(key); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseOffsetKey(%q) error = %v, want ErrMalformedKey", key, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{name: "ok", in: "vllm-0", ok: true},
		{name: "empty", in: ""},
		{name: "not_utf8", in: "a\xffb"},
		{name: "at_limit", in: strings.Repeat("a", MaxNameLen), ok: true},
		{name: "over_limit", in: strings.Repeat("a", MaxNameLen+1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName("pod", tc.in)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidName)) {
				t.Fatalf("ValidateName(%q) = %v, want ok=%v", tc.in, err, tc.ok)
			}
		})
	}
}

func TestNewRejectsBadPrefix(t *testing.T) {
	for _, p := range []string{"", "/kvindex"} {
		if _, err := New(p); !errors.Is(err, ErrInvalidPrefix) {
			t.Errorf("New(%q) error = %v, want ErrInvalidPrefix", p, err)
		}
	}
}

func TestRangeEnd(t *testing.T) {
	tests := map[string]string{
		"/kvindex/v2/chunks/": "/kvindex/v2/chunks0",
		"a\xff":               "b",
		"\xff\xff":            "\x00",
	}
	for in, want := range tests {
		if got := RangeEnd(in); got != want {
			t.Errorf("RangeEnd(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOffsetValues(t *testing.T) {
	for _, n := range []int64{0, 1, 1 << 40} {
		got, err := ParseOffset([]byte(FormatOffset(n)))
		if err != nil || got != n {
			t.Fatalf("ParseOffset(FormatOffset(%d)) = %d, %v", n, got, err)
		}
	}
	for _, bad := range []string{"", "-1", "01", "1.0", " 1", "x"} {
		if _, err := ParseOffset([]byte(bad)); !errors.Is(err, ErrMalformedValue) {
			t.Errorf("ParseOffset(%q) error = %v, want ErrMalformedValue", bad, err)
		}
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	seq := uint64(41)
	group := int64(3)
	rec := EndpointRecord{
		AttentionGroup: &group,
		MediumMap:      "0123456789abcdef",
		BlockSize:      16,
		HashMode:       HashModeEngine,
		Seq:            &seq,
		BatchTS:        1733000000.25,
		Incarnation:    "engine-1",
		LastRecord:     time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC),
		Topic:          "kvindex-events",
		Partition:      3,
		Lease:          0x694d7b3c5c2b1e04,
		TierLeases:     map[string][]LeaseShard{"gpu": {{ID: 0x694d7b3c5c2b1e05, Keys: 10}}},
		ChunkNext:      map[string]uint64{"gpu": 12, "disk": 1},
	}
	b, err := rec.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"lease":"694d7b3c5c2b1e04"`) {
		t.Fatalf("lease id not stored in etcdctl's hex form: %s", b)
	}
	got, err := UnmarshalEndpointRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rec, got); diff != "" {
		t.Fatalf("endpoint record round trip (-want +got):\n%s", diff)
	}
	if got.Shards(tier.GPU)[0].Keys != 10 || got.Shards(tier.CPU) != nil {
		t.Fatalf("Shards = %v / %v", got.Shards(tier.GPU), got.Shards(tier.CPU))
	}
	for _, bad := range []string{`{`, `{"hash_mode":"nope"}`, `{"hash_mode":"engine","lease":"zz"}`, `{"hash_mode":"engine","tier_leases":{"hbm":[]}}`, `{"hash_mode":"engine","attention_group":-1}`, `{"hash_mode":"engine","attention_group":"3"}`, `{"hash_mode":"engine","chunk_next":{"hbm":1}}`, `{"hash_mode":"engine","chunk_next":{"gpu":-1}}`, `null`, ` null `, `{"hash_mode":"engine","chunk_next":{"gpu":9223372036854775809}}`} {
		if _, err := UnmarshalEndpointRecord([]byte(bad)); !errors.Is(err, ErrMalformedValue) {
			t.Errorf("UnmarshalEndpointRecord(%s) error = %v, want ErrMalformedValue", bad, err)
		}
	}
	if _, err := UnmarshalEndpointMeta([]byte("null")); !errors.Is(err, ErrMalformedValue) {
		t.Errorf("UnmarshalEndpointMeta(null) error = %v, want ErrMalformedValue", err)
	}
	meta, err := UnmarshalEndpointMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := (EndpointMeta{BlockSize: rec.BlockSize, HashMode: rec.HashMode, LastRecord: rec.LastRecord, Partition: rec.Partition}); meta != want {
		t.Fatalf("UnmarshalEndpointMeta = %+v, want %+v", meta, want)
	}
	// The hash mode as stored, and absent (a record written before v1.1)
	// read as engine.
	for _, tc := range []struct {
		name, value string
		want        HashMode
	}{
		{"token", `{"hash_mode":"token","block_size":16}`, HashModeToken},
		{"engine", `{"hash_mode":"engine","block_size":16}`, HashModeEngine},
		{"absent", `{"block_size":16}`, HashModeEngine},
		{"empty", `{"hash_mode":"","block_size":16}`, HashModeEngine},
	} {
		t.Run("hash_mode_"+tc.name, func(t *testing.T) {
			m, err := UnmarshalEndpointMeta([]byte(tc.value))
			if err != nil || m.HashMode != tc.want || m.BlockSize != 16 {
				t.Fatalf("UnmarshalEndpointMeta(%s) = %+v, %v; want hash mode %q", tc.value, m, err, tc.want)
			}
			r, err := UnmarshalEndpointRecord([]byte(tc.value))
			if err != nil || r.HashMode != tc.want {
				t.Fatalf("UnmarshalEndpointRecord(%s) = %+v, %v; want hash mode %q", tc.value, r, err, tc.want)
			}
		})
	}
	for _, bad := range []string{`{`, `[]`, `{"hash_mode":"nope"}`, `{"hash_mode":"engine","tier_leases":{"hbm":[]}}`, `{"hash_mode":"engine","partition":"3"}`, `{"hash_mode":"engine","tier_leases":{"gpu":3}}`} {
		if _, err := UnmarshalEndpointMeta([]byte(bad)); !errors.Is(err, ErrMalformedValue) {
			t.Errorf("UnmarshalEndpointMeta(%s) error = %v, want ErrMalformedValue", bad, err)
		}
	}
	own := OwnerRecord{MemberID: "m-1", Generation: 4, Nonce: "n", Claimed: time.Unix(5, 0).UTC()}
	ob, err := own.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if gotOwn, err := UnmarshalOwnerRecord(ob); err != nil || !cmp.Equal(own, gotOwn) {
		t.Fatalf("owner record round trip: %v, %v", gotOwn, err)
	}
	ing := IngesterRecord{Host: "h", Started: time.Unix(6, 0).UTC(), Partitions: []string{"t/0"}}
	ib, err := ing.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if gotIng, err := UnmarshalIngesterRecord(ib); err != nil || !cmp.Equal(ing, gotIng) {
		t.Fatalf("ingester record round trip: %v, %v", gotIng, err)
	}
}

func TestMemberKeyRoundTrip(t *testing.T) {
	ks := Default()
	p := Partition{Topic: "kv events", Partition: 7}
	ep := Endpoint{Model: "meta/llama", Pod: "team-a/vllm 0@10.0.0.5:8000", Rank: 2}
	key := ks.MemberKey(p, ep)
	if diff := cmp.Diff("/kvindex/v2/members/kv%20events/7/meta%2Fllama/team-a%2Fvllm%200@10.0.0.5:8000/2", key); diff != "" {
		t.Errorf("MemberKey (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(key, ks.MembersPrefix(p)) || ks.KindOf(key) != KindMember {
		t.Errorf("%q: not under MembersPrefix %q or kind %v", key, ks.MembersPrefix(p), ks.KindOf(key))
	}
	gotP, gotEp, err := ks.ParseMemberKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2]any{p, ep}, [2]any{gotP, gotEp}); diff != "" {
		t.Errorf("ParseMemberKey (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"/kvindex/v2/members/t/7", "/kvindex/v2/members/t/x/m/p/0", "/kvindex/v2/members/t/7/m/p", "/kvindex/v2/endpoints/m/p/0"} {
		if _, _, err := ks.ParseMemberKey(bad); !errors.Is(err, ErrMalformedKey) {
			t.Errorf("ParseMemberKey(%q) = %v, want ErrMalformedKey", bad, err)
		}
	}
}

func TestParseHashText(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{in: "e5068d13bba8906f", want: 0xe5068d13bba8906f},
		{in: "0xE5068D13BBA8906F", want: 0xe5068d13bba8906f},
		{in: "0X1", want: 1},
		{in: "ff", want: 0xff},
		{in: "", wantErr: true},
		{in: "0x", wantErr: true},
		{in: "+1", wantErr: true},
		{in: "1_0", wantErr: true},
		{in: "g", wantErr: true},
		{in: "1ffffffffffffffff", wantErr: true}, // 65 bits
	}
	for _, tc := range tests {
		got, err := ParseHashText(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseHashText(%q) = %#x, %v; want %#x, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestCompareEndpoints(t *testing.T) {
	eps := []Endpoint{
		{Model: "m2", Pod: "a", Rank: 0},
		{Model: "m1", Pod: "b", Rank: 0},
		{Model: "m1", Pod: "a", Rank: 10},
		{Model: "m1", Pod: "a", Rank: 2},
		{Model: "m1", Pod: "B", Rank: 0},
	}
	slices.SortFunc(eps, CompareEndpoints)
	want := []Endpoint{
		{Model: "m1", Pod: "B", Rank: 0},
		{Model: "m1", Pod: "a", Rank: 2},
		{Model: "m1", Pod: "a", Rank: 10},
		{Model: "m1", Pod: "b", Rank: 0},
		{Model: "m2", Pod: "a", Rank: 0},
	}
	if diff := cmp.Diff(want, eps); diff != "" {
		t.Errorf("sorted endpoints (-want +got):\n%s", diff)
	}
}

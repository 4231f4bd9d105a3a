package events

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/tier"
)

// TestDefaultMediumTable decodes a removal on every medium of the DESIGN
// v1.1 table, in its own spelling, in lower case and in mixed case, plus
// mediums that are in no table: each must land in its tier or be skipped as
// unknown_medium.
func TestDefaultMediumTable(t *testing.T) {
	want := map[string]tier.Tier{
		"": tier.GPU, "GPU": tier.GPU, "DEVICE": tier.GPU,
		"CPU": tier.CPU, "CPU_PINNED": tier.CPU, "CPU_TIER1": tier.CPU,
		"CPU_TIER2": tier.Disk, "DISK": tier.Disk, "NVME": tier.Disk, "STORAGE": tier.Disk, "EXTERNAL": tier.Disk, "REMOTE": tier.Disk,
	}
	if diff := cmp.Diff(want, map[string]tier.Tier(DefaultMediums())); diff != "" {
		t.Fatalf("DefaultMediums (-DESIGN +got):\n%s", diff)
	}
	dec := NewDecoder(nil)
	for name, tr := range want {
		for _, spelling := range []string{name, strings.ToLower(name), mixedCase(name)} {
			t.Run(spelling, func(t *testing.T) {
				var medium any = spelling
				if spelling == "" {
					medium = nil
				}
				b, err := dec.Decode(encode(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, medium}, map[string]any{"type": "TierBlocksCleared", "medium": medium}}}))
				if err != nil {
					t.Fatal(err)
				}
				if len(b.Events) != 2 || b.Events[0].Tier != tr || b.Events[1].Tier != tr || b.Events[0].Medium != spelling {
					t.Fatalf("events %+v skipped %+v, want both in %v", b.Events, b.Skipped, tr)
				}
			})
		}
	}
	for _, unknown := range []string{"HBM", "GPU ", "CPU-TIER2", "L3", "disk0", "ＧＰＵ"} {
		t.Run("unknown_"+unknown, func(t *testing.T) {
			b, err := dec.Decode(encode(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{}, 0, nil, unknown}, []any{"TierBlocksCleared", unknown}}}))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 0 || len(b.Skipped) != 2 || b.Skipped[0].Reason != SkipUnknownMedium || b.Skipped[1].Reason != SkipUnknownMedium {
				t.Fatalf("events %+v skipped %+v, want two unknown_medium skips", b.Events, b.Skipped)
			}
		})
	}
}

// mixedCase alternates upper and lower case letters.
func mixedCase(s string) string {
	b := []byte(s)
	for i := range b {
		if i%2 == 1 && b[i] >= 'A' && b[i] <= 'Z' {
			b[i] += 'a' - 'A'
		}
	}
	return string(b)
}

// TestMediumCacheAcrossEvents checks the decoder's one-entry medium cache:
// alternating mediums, and a lora_name equal to a medium, must still map
// every event by its own medium.
func TestMediumCacheAcrossEvents(t *testing.T) {
	dec := NewDecoder(nil)
	evs := []any{}
	mediums := []string{"gpu", "CPU_TIER2", "CPU_TIER2", "gpu", "cpu", "nvme", "HBM", "cpu"}
	for _, m := range mediums {
		evs = append(evs, map[string]any{"type": "BlockStored", "block_hashes": []any{1}, "lora_name": "cpu_tier2", "medium": m})
	}
	b, err := dec.Decode(encode(t, []any{1.0, evs}))
	if err != nil {
		t.Fatal(err)
	}
	var got []tier.Tier
	for _, ev := range b.Events {
		got = append(got, ev.Tier)
	}
	want := []tier.Tier{tier.GPU, tier.Disk, tier.Disk, tier.GPU, tier.CPU, tier.Disk, tier.CPU}
	if diff := cmp.Diff(want, got); diff != "" || len(b.Skipped) != 1 || b.Skipped[0].Index != 6 {
		t.Fatalf("tiers (-want +got):\n%s\nskipped %+v", diff, b.Skipped)
	}
}

func TestMediumMapValidate(t *testing.T) {
	tests := []struct {
		name string
		m    MediumMap
		want string // substring of the error; "" for none
	}{
		{name: "default", m: DefaultMediums()},
		{name: "same_tier_two_spellings", m: MediumMap{"Disk": tier.Disk, "DISK": tier.Disk}},
		{name: "spellings_disagree", m: MediumMap{"Disk": tier.CPU, "DISK": tier.Disk}, want: `"DISK" and "Disk" differ only in case`},
		{name: "not_a_tier", m: MediumMap{"HBM": tier.Unknown}, want: `medium "HBM" maps to unknown(0)`},
		{name: "out_of_range", m: MediumMap{"X": tier.Tier(9)}, want: "not a tier"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.m.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestMediumMapLookup(t *testing.T) {
	m := MediumMap{"Disk": tier.Disk, "HBM": tier.GPU, "bad": tier.Unknown}
	for _, tc := range []struct {
		medium string
		want   tier.Tier
		ok     bool
	}{
		{"Disk", tier.Disk, true}, {"DISK", tier.Disk, true}, {"disk", tier.Disk, true},
		{"hbm", tier.GPU, true}, {"bad", tier.Unknown, false}, {"", tier.Unknown, false}, {"CPU", tier.Unknown, false},
	} {
		if got, ok := m.Lookup(tc.medium); got != tc.want || ok != tc.ok {
			t.Errorf("Lookup(%q) = %v, %v; want %v, %v", tc.medium, got, ok, tc.want, tc.ok)
		}
	}
}

// TestMediumMapFingerprint: the fingerprint depends on what the map does,
// not on how its names are spelled or in which order they were added, and
// changes when any medium moves tier, appears or goes.
func TestMediumMapFingerprint(t *testing.T) {
	base := DefaultMediums().Fingerprint()
	if len(base) != FingerprintLen || strings.Trim(base, "0123456789abcdef") != "" {
		t.Fatalf("fingerprint %q is not %d lower-case hex digits", base, FingerprintLen)
	}
	lower := MediumMap{}
	for name, tr := range DefaultMediums() {
		lower[strings.ToLower(name)] = tr
	}
	if got := lower.Fingerprint(); got != base {
		t.Errorf("lower-case spelling: fingerprint %s, want %s", got, base)
	}
	changed := map[string]func(MediumMap){
		"cpu_tier2_to_cpu": func(m MediumMap) { m["CPU_TIER2"] = tier.CPU },
		"added":            func(m MediumMap) { m["HBM"] = tier.GPU },
		"removed":          func(m MediumMap) { delete(m, "REMOTE") },
		"nil_to_cpu":       func(m MediumMap) { m[""] = tier.CPU },
	}
	seen := map[string]string{base: "default"}
	for name, change := range changed {
		m := DefaultMediums()
		change(m)
		fp := m.Fingerprint()
		if other, ok := seen[fp]; ok {
			t.Errorf("%s: fingerprint %s equals that of %s", name, fp, other)
		}
		seen[fp] = name
	}
	// Length-prefixed lines: a name holding "=tier\n" cannot forge two.
	a := MediumMap{"A=gpu\n1:B": tier.GPU}
	b := MediumMap{"A": tier.GPU, "B": tier.GPU}
	if a.Fingerprint() == b.Fingerprint() {
		t.Errorf("a name with an embedded line forged another map's fingerprint")
	}
}

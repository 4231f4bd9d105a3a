package scenario

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLoadFixtures(t *testing.T) {
	all, err := Glob(filepath.Join("..", "..", "testdata", "fixtures", "scenarios", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 12 {
		t.Fatalf("loaded %d scenarios, want at least 12", len(all))
	}
	for _, s := range all {
		var pubs, looks int
		for _, st := range s.Steps {
			switch st.Kind {
			case KindPublish:
				pubs++
			case KindLookup:
				looks++
			}
		}
		if s.Name == "" || pubs == 0 || looks == 0 {
			t.Errorf("%s: name %q, %d publishes, %d lookups", s.Path, s.Name, pubs, looks)
		}
	}
	i := slices.IndexFunc(all, func(s *Scenario) bool { return s.Name == "p07_large_event" })
	if i < 0 {
		t.Fatal("no p07_large_event scenario")
	}
	if p07 := all[i]; len(p07.Steps[1].Lookup.Hashes) != 1000 {
		t.Fatalf("p07 parsed wrong: %d hashes", len(p07.Steps[1].Lookup.Hashes))
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, in string
	}{
		{name: "empty", in: ""},
		{name: "no_scenario_line", in: `{"step":"lookup","model":"m","hashes":[],"expect":[]}`},
		{name: "bad_json", in: `{"step":"scenario"` + "\n"},
		{name: "unknown_step", in: `{"step":"scenario"}` + "\n" + `{"step":"sleep"}`},
		{name: "bad_base64", in: `{"step":"scenario"}` + "\n" + `{"step":"publish","key":"p","headers":{"model":"m"},"value_b64":"!!"}`},
		{name: "no_model_header", in: `{"step":"scenario"}` + "\n" + `{"step":"publish","key":"p","headers":{},"value_b64":""}`},
		{name: "bad_hash", in: `{"step":"scenario"}` + "\n" + `{"step":"lookup","model":"m","hashes":["xyz"],"expect":[]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse(strings.NewReader(tc.in)); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestCompare(t *testing.T) {
	expect := []Match{{Pod: "a", Blocks: 2, Tiers: []string{"gpu", "cpu"}}, {Pod: "b", DPRank: 1, Blocks: 1}}
	tests := []struct {
		name   string
		actual []Match
		want   []string
	}{
		{name: "equal_any_order", actual: []Match{{Pod: "b", DPRank: 1, Blocks: 1, Tiers: []string{"disk"}}, {Pod: "a", Blocks: 2, Tiers: []string{"gpu", "cpu"}}}},
		{name: "missing", actual: []Match{{Pod: "a", Blocks: 2, Tiers: []string{"gpu", "cpu"}}}, want: []string{"b rank 1: expected 1 blocks, got none"}},
		{name: "wrong_count", actual: []Match{{Pod: "a", Blocks: 1, Tiers: []string{"gpu"}}, {Pod: "b", DPRank: 1, Blocks: 1}}, want: []string{"a rank 0: expected 2 blocks, got 1"}},
		{name: "wrong_tier", actual: []Match{{Pod: "a", Blocks: 2, Tiers: []string{"gpu", "gpu"}}, {Pod: "b", DPRank: 1, Blocks: 1}}, want: []string{"a rank 0: expected tiers [gpu cpu], got [gpu gpu]"}},
		{name: "extra", actual: []Match{{Pod: "a", Blocks: 2, Tiers: []string{"gpu", "cpu"}}, {Pod: "b", DPRank: 1, Blocks: 1}, {Pod: "c", Blocks: 3}}, want: []string{"c rank 0: expected nothing, got 3 blocks"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Compare(expect, tc.actual)); diff != "" {
				t.Fatalf("Compare (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseTokenLookup(t *testing.T) {
	head := `{"step": "scenario", "name": "t", "hash_mode": "token"}` + "\n"
	for _, tc := range []struct {
		name    string
		line    string
		want    *Lookup
		wantErr string
	}{
		{name: "tokens_with_extras",
			line: `{"step": "lookup", "model": "m", "tokens": [1, 2, 3, 4], "block_size": 2, "lora_name": "sql-lora", "cache_salt": "tenant-7", "expect": [{"pod": "p", "blocks": 2}]}`,
			want: &Lookup{Model: "m", Hashes: []uint64{}, Tokens: &Tokens{TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAName: "sql-lora", CacheSalt: "tenant-7"},
				Expect: []Match{{Pod: "p", Blocks: 2}}}},
		{name: "tokens_expecting_nothing",
			line: `{"step": "lookup", "model": "m", "tokens": [], "block_size": 16}`,
			want: &Lookup{Model: "m", Hashes: []uint64{}, Tokens: &Tokens{TokenIDs: []uint32{}, BlockSize: 16}, Expect: []Match{}}},
		{name: "hashes_and_tokens", line: `{"step": "lookup", "model": "m", "hashes": ["01"], "tokens": [1], "block_size": 1}`, wantErr: "both hashes and tokens"},
		{name: "tokens_without_block_size", line: `{"step": "lookup", "model": "m", "tokens": [1]}`, wantErr: "positive block_size"},
		{name: "lora_without_tokens", line: `{"step": "lookup", "model": "m", "hashes": ["01"], "lora_name": "l"}`, wantErr: "go with tokens"},
		{name: "token_id_too_big", line: `{"step": "lookup", "model": "m", "tokens": [4294967296], "block_size": 1}`, wantErr: "line 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(strings.NewReader(head + tc.line))
			if tc.wantErr != "" {
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want ErrMalformed containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, s.Steps[0].Lookup); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLookupCheckBlockSize(t *testing.T) {
	tok := &Lookup{Tokens: &Tokens{BlockSize: 16}, Expect: []Match{{Pod: "a", Blocks: 2}}}
	hash := &Lookup{Expect: []Match{{Pod: "a", Blocks: 2}}}
	for _, tc := range []struct {
		name   string
		lookup *Lookup
		actual []Match
		want   []string
	}{
		{"token_block_size_agrees", tok, []Match{{Pod: "a", Blocks: 2, BlockSize: 16}}, nil},
		{"token_block_size_differs", tok, []Match{{Pod: "a", Blocks: 2, BlockSize: 32}}, []string{"a rank 0: expected block size 16, got 32"}},
		{"hash_lookup_ignores_block_size", hash, []Match{{Pod: "a", Blocks: 2, BlockSize: 32}}, nil},
		{"blocks_still_checked", tok, []Match{{Pod: "a", Blocks: 1, BlockSize: 16}}, []string{"a rank 0: expected 2 blocks, got 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.lookup.Check(tc.actual)); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

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
		want     string // in the message, when set
	}{
		{name: "empty", in: ""},
		// In the file's terms, never the Go type decoded into.
		{name: "array_line", in: "[1,2,3]\n", want: "line 1: a JSON array where a step object is wanted"},
		{name: "field_of_wrong_type", in: `{"step":"scenario","name":5}`, want: `line 1: field "name" is a JSON number, want a string`},
		{name: "no_scenario_line", in: `{"step":"lookup","model":"m","hashes":[],"expect":[]}`},
		{name: "bad_json", in: `{"step":"scenario"` + "\n"},
		{name: "unknown_step", in: `{"step":"scenario"}` + "\n" + `{"step":"sleep"}`},
		{name: "bad_base64", in: `{"step":"scenario"}` + "\n" + `{"step":"publish","key":"p","headers":{"model":"m"},"value_b64":"!!"}`},
		{name: "no_model_header", in: `{"step":"scenario"}` + "\n" + `{"step":"publish","key":"p","headers":{},"value_b64":""}`},
		{name: "bad_hash", in: `{"step":"scenario"}` + "\n" + `{"step":"lookup","model":"m","hashes":["xyz"],"expect":[]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.in))
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want ErrMalformed with %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "Go value") {
				t.Fatalf("Parse error %q names a Go type", err)
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

func TestTokenLookupSteps(t *testing.T) {
	head := `{"step": "scenario", "name": "t", "hash_mode": "token"}` + "\n"
	tests := []struct {
		name, file string
		want       *Lookup
		err        bool
	}{
		{
			name: "tokens_with_extras",
			file: head + `{"step": "lookup", "model": "m", "tokens": [1, 2, 3, 4], "block_size": 2, "lora_name": "l", "cache_salt": "s", "expect": []}`,
			want: &Lookup{Model: "m", Hashes: []uint64{}, Tokens: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAName: "l", CacheSalt: "s", Expect: []Match{}},
		},
		{name: "tokens_in_an_engine_mode_file", file: `{"step": "scenario", "name": "t"}` + "\n" + `{"step": "lookup", "model": "m", "tokens": [1], "block_size": 1}`, err: true},
		{name: "tokens_without_block_size", file: head + `{"step": "lookup", "model": "m", "tokens": [1]}`, err: true},
		{name: "tokens_and_hashes", file: head + `{"step": "lookup", "model": "m", "tokens": [1], "block_size": 1, "hashes": ["01"]}`, err: true},
		{name: "token_out_of_range", file: head + `{"step": "lookup", "model": "m", "tokens": [4294967296], "block_size": 1}`, err: true},
		{name: "salt_without_tokens", file: head + `{"step": "lookup", "model": "m", "hashes": ["01"], "cache_salt": "s"}`, err: true},
		{name: "unknown_mode", file: `{"step": "scenario", "name": "t", "hash_mode": "sha"}`, err: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(strings.NewReader(tc.file))
			if tc.err {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Parse = %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.HashMode != HashModeToken {
				t.Errorf("hash mode %q, want token", s.HashMode)
			}
			if diff := cmp.Diff(tc.want, s.Steps[0].Lookup); diff != "" {
				t.Errorf("lookup (-want +got):\n%s", diff)
			}
		})
	}
	s, err := Parse(strings.NewReader(`{"step": "scenario", "name": "t"}`))
	if err != nil || s.HashMode != HashModeEngine {
		t.Errorf("a file without hash_mode: %q, %v; want engine", s.HashMode, err)
	}
}

func TestLookupCheckBlockSize(t *testing.T) {
	l := &Lookup{Tokens: []uint32{1, 2}, BlockSize: 2, Expect: []Match{{Pod: "a", Blocks: 1}}}
	if d := l.Check([]Match{{Pod: "a", Blocks: 1, BlockSize: 2}}); d != nil {
		t.Errorf("matching block size: %v", d)
	}
	if d := l.Check([]Match{{Pod: "a", Blocks: 1, BlockSize: 16}}); len(d) != 1 {
		t.Errorf("another block size: %v, want one difference", d)
	}
}

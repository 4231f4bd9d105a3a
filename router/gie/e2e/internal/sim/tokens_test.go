package sim

import (
	"slices"
	"strings"
	"testing"
)

func TestBlockTokensDeterministic(t *testing.T) {
	a := AppendBlockTokens(nil, 42, BlockTokens)
	b := AppendBlockTokens(nil, 42, BlockTokens)
	if len(a) != BlockTokens || !slices.Equal(a, b) {
		t.Fatalf("block 42: %d tokens, equal twice: %v", len(a), slices.Equal(a, b))
	}
	if c := AppendBlockTokens(nil, 43, BlockTokens); slices.Equal(a, c) {
		t.Error("blocks 42 and 43 have the same tokens")
	}
	if p := AppendBlockTokens(nil, 42, 100); !slices.Equal(p, a[:100]) {
		t.Error("a partial block is not a prefix of the full block's tokens")
	}
	for _, tk := range a {
		if tk >= Vocab {
			t.Fatalf("token %d outside the vocabulary", tk)
		}
	}
	distinct := map[uint32]bool{}
	for _, tk := range a {
		distinct[tk] = true
	}
	if len(distinct) < BlockTokens/2 {
		t.Errorf("only %d distinct tokens in a block", len(distinct))
	}
}

func TestPromptTextRoundTrip(t *testing.T) {
	r := Request{IDs: []uint64{5, 0xdeadbeef, 7}, Keys: chainKeys([]uint64{5, 0xdeadbeef}), LastTokens: 300}
	text := PromptText(r)
	if len(text) != 3*SegmentChars {
		t.Fatalf("prompt of %d characters, want %d (2048 a block id)", len(text), 3*SegmentChars)
	}
	got, err := ParsePrompt(text)
	if err != nil {
		t.Fatal(err)
	}
	if want := PromptTokens(r); !slices.Equal(got, want) || len(want) != r.Tokens() {
		t.Errorf("parsed %d tokens, want %d (the request's %d)", len(got), len(want), r.Tokens())
	}
	// A full block's text is the same in every request; the partial last
	// block's differs from the same block full.
	other := PromptText(Request{IDs: []uint64{5, 9}, Keys: chainKeys([]uint64{5}), LastTokens: 10})
	if text[:SegmentChars] != other[:SegmentChars] {
		t.Error("block 5's text differs between requests")
	}
	full := PromptText(Request{IDs: []uint64{7, 1}, Keys: chainKeys([]uint64{7}), LastTokens: 1})
	if text[2*SegmentChars:] == full[:SegmentChars] {
		t.Error("the partial block 7 has the full block 7's text")
	}
}

func TestParsePromptRejects(t *testing.T) {
	seg := PromptText(Request{IDs: []uint64{1}, LastTokens: 5})
	for name, text := range map[string]string{
		"empty":       "",
		"short":       seg[:100],
		"no header":   strings.Repeat("x", SegmentChars),
		"bad id":      "[zzzzzzzzzzzzzzzz/512]" + seg[segmentHeader:],
		"bad count":   "[0000000000000001/000]" + seg[segmentHeader:],
		"count > 512": "[0000000000000001/999]" + seg[segmentHeader:],
	} {
		if _, err := ParsePrompt(text); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

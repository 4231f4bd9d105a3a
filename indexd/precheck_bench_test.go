package indexd

import (
	"testing"

	"google.golang.org/protobuf/proto"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// BenchmarkPrecheckLookup times the codec's count of a token Lookup's
// repeated fields on the wire (precheckLookup) against decoding the same
// bytes (proto.Unmarshal, the reference in the same run): a 256-block
// prompt of 16-token blocks (token ids of 3 varint bytes) with 64
// candidates, as a router sends.
func BenchmarkPrecheckLookup(b *testing.B) {
	req := &kvindexv1.LookupRequest{Model: "meta-llama/Llama-3.1-8B-Instruct", Tokens: &kvindexv1.TokenPrompt{}}
	for i := range 4096 {
		req.Tokens.TokenIds = append(req.Tokens.TokenIds, uint32(20000+i%10000))
	}
	for i := range 64 {
		req.Candidates = append(req.Candidates, &kvindexv1.Endpoint{Pod: "10.0.0." + string(rune('0'+i%10)) + ":8000", DpRank: uint32(i % 4)})
	}
	wire, err := proto.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	b.Run("precheck", func(b *testing.B) {
		b.SetBytes(int64(len(wire)))
		for b.Loop() {
			if err := cfg.precheckLookup(wire); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal_reference", func(b *testing.B) {
		b.SetBytes(int64(len(wire)))
		for b.Loop() {
			var got kvindexv1.LookupRequest
			if err := proto.Unmarshal(wire, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
}

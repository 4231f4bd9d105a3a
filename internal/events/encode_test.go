package events

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/internal/tier"
)

func TestEncodeRoundTrip(t *testing.T) {
	in := Batch{
		TS:      1733000000.25,
		Rank:    2,
		HasRank: true,
		Events: []Event{
			{Type: BlockStored, BlockHashes: []uint64{1, 1 << 63}, ParentHash: 7, HasParent: true, TokenIDs: []int64{5, 6, 7, 8}, BlockSize: 2, Medium: "GPU", Tier: tier.GPU, LoraName: "adapter"},
			{Type: BlockStored, Index: 1, BlockHashes: []uint64{3}, Medium: "CPU", Tier: tier.CPU},
			{Type: BlockRemoved, Index: 2, BlockHashes: []uint64{1}, Medium: "Disk", Tier: tier.Disk},
			{Type: AllBlocksCleared, Index: 3},
		},
	}
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		payload, err := Encode(in, enc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := NewDecoder(nil).Decode(payload)
		if err != nil {
			t.Fatalf("encoding %d: %v", enc, err)
		}
		if diff := cmp.Diff(in, got); diff != "" {
			t.Fatalf("encoding %d round trip (-want +got):\n%s", enc, diff)
		}
	}
	if _, err := Encode(Batch{Events: []Event{{Type: 9}}}, EncodingMap); err == nil {
		t.Fatal("encoding an unknown event type succeeded")
	}
}

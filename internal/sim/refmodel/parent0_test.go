package refmodel

import (
	"testing"

	"github.com/kvindex/kvindex/internal/keyspace"
)

// TestTokenParentZeroIsRoot: in token mode a store whose parent_block_hash
// is 0, on an endpoint that holds no block 0, is keyed as a root (DESIGN
// "Hashing", parent 0), as the ingester keys it. Before, the model skipped
// it as an unknown parent, so a comparison on a stream with such stores
// (llm-d-inference-sim sends them) reported a false difference.
func TestTokenParentZeroIsRoot(t *testing.T) {
	m := New(Config{HashMode: keyspace.HashModeToken})
	ev := map[string]any{"type": "BlockStored", "block_hashes": []uint64{7, 8}, "parent_block_hash": 0,
		"token_ids": []int{1, 2, 3, 4, 5, 6, 7, 8}, "block_size": 4, "medium": "GPU"}
	m.Apply(Record{Key: "p", Headers: map[string]string{"model": "m"}, Value: batch(t, 1, 0, ev)})
	if got := len(m.Blocks()); got != 2 {
		t.Fatalf("%d blocks after a root store with parent 0, want 2 (skipped %v)", got, m.skipped)
	}
}

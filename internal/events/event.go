package events

import (
	"fmt"

	"github.com/kvindex/kvindex/internal/tier"
)

// Type is a KV event type.
type Type uint8

// The KV event types vLLM publishes (vllm.distributed.kv_events).
const (
	// BlockStored: block_hashes became present on the endpoint in a tier.
	BlockStored Type = iota + 1
	// BlockRemoved: block_hashes were evicted from a tier.
	BlockRemoved
	// AllBlocksCleared: the endpoint dropped every block in every tier.
	AllBlocksCleared
	// TierBlocksCleared: the endpoint dropped every block of one tier, the
	// one its medium maps to (DESIGN v1.1; vLLM's GPU-only prefix-cache
	// reset). A nil medium means the GPU.
	TierBlocksCleared
)

// String returns the wire tag of the type ("BlockStored", ...).
func (t Type) String() string {
	switch t {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	case TierBlocksCleared:
		return "TierBlocksCleared"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// parseType maps a wire tag to its type; ok is false for unknown tags.
func parseType(tag []byte) (Type, bool) {
	switch string(tag) {
	case "BlockStored":
		return BlockStored, true
	case "BlockRemoved":
		return BlockRemoved, true
	case "AllBlocksCleared":
		return AllBlocksCleared, true
	case "TierBlocksCleared":
		return TierBlocksCleared, true
	}
	return 0, false
}

// Event is one decoded, valid KV event. Fields that do not belong to its
// Type are zero.
type Event struct {
	// Type is the event type.
	Type Type
	// Index is the event's position in its batch's events array, counting
	// skipped events too, so logs can point at the wire.
	Index int
	// BlockHashes are the blocks stored or removed, in event order, in
	// 64-bit form: a uint64 as is, an int64 reinterpreted (SGLang), the last
	// 8 bytes of a byte digest read big-endian (vLLM's conversion to int).
	BlockHashes []uint64
	// ParentHash is the hash of the block before BlockHashes[0]
	// (BlockStored); meaningful only when HasParent.
	ParentHash uint64
	// HasParent is false when parent_block_hash was nil (the prefix starts
	// at this event's first block).
	HasParent bool
	// TokenIDs are the tokens of the stored blocks (BlockStored); empty for
	// offload placeholders.
	TokenIDs []int64
	// BlockSize is the engine's block size in tokens (BlockStored); 0 for
	// offload placeholders.
	BlockSize uint32
	// Medium is the engine's medium string as sent; empty when nil.
	Medium string
	// Tier is Medium mapped through the decoder's MediumMap, matched
	// case-insensitively (BlockStored, BlockRemoved, TierBlocksCleared).
	Tier tier.Tier
	// LoraName is the adapter name of the stored blocks, when any.
	LoraName string
	// HasExtraKeys reports a non-nil extra_keys array of ExtraKeysLen
	// elements (meant to be one per block). ExtraKeys are their keys in
	// order: nil when every element was nil, else ExtraKeysLen entries,
	// each nil or one block's keys. Token mode folds them into the
	// canonical key; engine-hash mode ignores them.
	HasExtraKeys bool
	ExtraKeysLen int
	ExtraKeys    [][]Extra
	// BadExtraKeys, when not empty, says why extra_keys could not be read.
	// The event is still valid (engine-hash mode needs no extra keys);
	// token mode cannot key it and skips it.
	BadExtraKeys string
	// GroupIdx is the KV-cache group (hybrid models: mamba, sliding-window
	// and attention groups in one engine) of a BlockStored or BlockRemoved;
	// nil decodes as 0. The decoder keeps every group: which one an
	// endpoint indexes is the ingester's decision (DESIGN v1.1 "Event wire
	// format", docs/semantics.md).
	GroupIdx int64
	// KVCacheSpecKind is a BlockStored's kv_cache_spec_kind as sent
	// ("full_attention", "mla_attention", "sliding_window", "mamba", ...);
	// empty when nil or absent.
	KVCacheSpecKind string
}

// The kv_cache_spec_kind values that mark an attention group, the one group
// an endpoint indexes (DESIGN v1.1).
const (
	KindFullAttention = "full_attention"
	KindMLAAttention  = "mla_attention"
)

// Attention reports whether ev is a BlockStored whose kv_cache_spec_kind is
// exactly "full_attention" or "mla_attention": a store that fixes its
// endpoint's indexed group. A nil kind, or any other, is not attention.
func (ev *Event) Attention() bool {
	return ev.Type == BlockStored && (ev.KVCacheSpecKind == KindFullAttention || ev.KVCacheSpecKind == KindMLAAttention)
}

// SkipReason says why an event was left out of a batch.
type SkipReason uint8

// The skip reasons; String gives their metric label.
const (
	// SkipUnknownType: an event type this decoder does not know.
	SkipUnknownType SkipReason = iota + 1
	// SkipInvalid: a known event whose fields are of the wrong type or
	// range.
	SkipInvalid
	// SkipUnknownMedium: a medium the MediumMap does not map to a tier.
	SkipUnknownMedium
	// SkipOtherGroup: a BlockStored or BlockRemoved of a KV-cache group
	// other than the one its endpoint indexes. The decoder never reports
	// it (it cannot know the endpoint's group); the ingester and the
	// reference model count it under this reason's label.
	SkipOtherGroup
)

// String returns the reason's metric label.
func (r SkipReason) String() string {
	switch r {
	case SkipUnknownType:
		return "unknown_type"
	case SkipInvalid:
		return "invalid_event"
	case SkipUnknownMedium:
		return "unknown_medium"
	case SkipOtherGroup:
		return "other_group"
	}
	return fmt.Sprintf("SkipReason(%d)", uint8(r))
}

// Skip reports one event left out of a batch.
type Skip struct {
	// Index is the event's position in the batch's events array.
	Index int
	// Tag is the event's type tag as sent (empty when it had none).
	Tag string
	// Reason is why it was skipped.
	Reason SkipReason
	// Detail says what was wrong, naming the field.
	Detail string
}

// Error renders the skip as a sentence for logs.
func (s Skip) Error() string {
	return fmt.Sprintf("event %d (%s): %s: %s", s.Index, s.Tag, s.Reason, s.Detail)
}

// Batch is one decoded KVEventBatch.
type Batch struct {
	// TS is the batch timestamp, seconds since the Unix epoch, as the engine
	// wrote it (float32 and float64 both decode).
	TS float64
	// Rank is the data_parallel_rank; 0 when the batch had none (HasRank
	// false).
	Rank uint32
	// HasRank reports whether the batch carried a non-nil rank.
	HasRank bool
	// Events are the valid events in batch order.
	Events []Event
	// Skipped are the events left out, in batch order.
	Skipped []Skip
}

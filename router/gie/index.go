package gie

import (
	"context"
	"time"
)

// Prompt is a request's prompt as kvindex looks it up: token ids plus the
// extras vLLM folds into its block hashes (the shape of the client's
// TokenPrompt, kept here so the core needs no client or GIE type).
type Prompt struct {
	// TokenIDs are the prompt's tokens, multimodal placeholders included.
	TokenIDs []uint32
	// LoRAName is the adapter serving the request ("" for the base model).
	LoRAName string
	// CacheSalt is the request's cache_salt ("" when none).
	CacheSalt string
	// MultiModal lists the prompt's multimodal items in token order.
	MultiModal []MultiModalItem
}

// MultiModalItem is one multimodal item of a prompt: its content hash and
// the span [Offset, Offset+Length) of its placeholder tokens in TokenIDs.
type MultiModalItem struct {
	Hash           string
	Offset, Length int
}

// Identity names one KV cache in kvindex: the pod as the bridge's --pod
// names it, and the data-parallel rank.
type Identity struct {
	Pod  string
	Rank uint32
}

// Tier is the memory tier holding a block; the values are kvindex's API
// values (kvindex.v1.Tier). Lower is better.
type Tier int32

// The tiers.
const (
	TierUnspecified Tier = 0
	TierGPU         Tier = 1
	TierCPU         Tier = 2
	TierDisk        Tier = 3
)

// IndexMatch is one endpoint's share of a looked-up prompt, as the index
// answers: its first Blocks blocks of BlockSize tokens are present on it,
// Tiers[i] being the best tier of block i.
type IndexMatch struct {
	Identity  Identity
	Blocks    int
	BlockSize int
	Tiers     []Tier
}

// IndexAnswer is one Lookup answer: the candidates holding at least the
// first block, and ProgressTime, when the answering replica last heard
// from etcd that its view was current (zero when the replica did not
// say, and for a partial cell-mode answer, whose progress time is only
// the answering cells'). The answer reflects every index write made
// before ProgressTime.
type IndexAnswer struct {
	Matches      []IndexMatch
	ProgressTime time.Time
}

// Index is what the Matcher needs of kvindex: one token-mode Lookup of
// model's prompt, restricted to candidates (every endpoint when empty).
// *KVIndex (kvclient.go) implements it with kvindex's Go client.
type Index interface {
	LookupTokens(ctx context.Context, model string, p Prompt, candidates []Identity) (IndexAnswer, error)
}

// EndpointLister is the optional part of an Index the producer uses to
// tell an identity mismatch from a cold cache: the identities the index
// holds for model (every model when empty), at most limit of them.
// *KVIndex implements it.
type EndpointLister interface {
	IndexedEndpoints(ctx context.Context, model string, limit int) ([]Identity, error)
}

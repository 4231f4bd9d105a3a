package indexd

import (
	"fmt"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/index"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// validateTokens checks a token Lookup's prompt against the API's rules
// and the limits (docs/limits.md): the token, multimodal item and extra
// length limits, and multimodal items in prompt order with spans of at
// least one token that do not overlap. Errors wrap ErrInvalidArgument and
// name the field and the limit.
func (s *Server) validateTokens(req *kvindexv1.LookupRequest) error {
	tp := req.Tokens
	if tp == nil {
		return nil
	}
	if len(req.BlockHashes) > 0 {
		return fmt.Errorf("%w: set either block_hashes or tokens, not both", ErrInvalidArgument)
	}
	if n := len(tp.TokenIds); n > s.cfg.MaxTokens {
		return errTooManyTokens(n, s.cfg.MaxTokens)
	}
	if err := s.checkExtra("tokens.lora_name", tp.LoraName); err != nil {
		return err
	}
	if err := s.checkExtra("tokens.cache_salt", tp.CacheSalt); err != nil {
		return err
	}
	if n := len(tp.MultimodalItems); n > s.cfg.MaxMultiModalItems {
		return errTooManyItems(n, s.cfg.MaxMultiModalItems)
	}
	var prevEnd uint64
	for i, it := range tp.MultimodalItems {
		field := fmt.Sprintf("tokens.multimodal_items[%d]", i)
		if it.GetHash() == "" {
			return fmt.Errorf("%w: %s.hash is required", ErrInvalidArgument, field)
		}
		if err := s.checkExtra(field+".hash", it.Hash); err != nil {
			return err
		}
		if it.Length == 0 {
			return fmt.Errorf("%w: %s.length is 0; an item spans at least one token", ErrInvalidArgument, field)
		}
		if i > 0 && uint64(it.Offset) < prevEnd {
			return fmt.Errorf("%w: %s starts at token %d, inside or before the item before it (which ends at %d): items must be in prompt order and must not overlap",
				ErrInvalidArgument, field, it.Offset, prevEnd)
		}
		prevEnd = uint64(it.Offset) + uint64(it.Length)
	}
	return nil
}

// checkExtra reports an extra longer than MaxExtraBytes.
func (s *Server) checkExtra(field, v string) error {
	if len(v) > s.cfg.MaxExtraBytes {
		return fmt.Errorf("%w: %s is %d bytes, the limit is %d (--max-extra-bytes)", ErrInvalidArgument, field, len(v), s.cfg.MaxExtraBytes)
	}
	return nil
}

// tokenKeyer is the index.Keyer of a validated token prompt: its
// canonical keys (client.AppendTokenKeys, docs/hashing.md) at a block
// size. The token ids are not copied.
func tokenKeyer(tp *kvindexv1.TokenPrompt) index.Keyer {
	p := client.TokenPrompt{TokenIDs: tp.TokenIds, LoRAName: tp.LoraName, CacheSalt: tp.CacheSalt}
	if n := len(tp.MultimodalItems); n > 0 {
		p.MultiModal = make([]client.MultiModalItem, n)
		for i, it := range tp.MultimodalItems {
			p.MultiModal[i] = client.MultiModalItem{Hash: it.Hash, Offset: int(it.Offset), Length: int(it.Length)}
		}
	}
	return func(dst []uint64, blockSize int) []uint64 { return client.AppendTokenKeys(dst, p, blockSize) }
}

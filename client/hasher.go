package client

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// Hasher computes vLLM's prefix-cache block hashes for
// --prefix-caching-hash-algo sha256_cbor with a fixed PYTHONHASHSEED, so a
// router can look up exactly the hashes a vLLM engine publishes in its KV
// events (DESIGN "Hashing", engine-hash mode). Vectors:
// client/testdata/hashing/vllm_sha256_cbor.json.
//
// The scheme (vLLM v1 kv_cache_utils): the root is sha256 of the canonical
// CBOR encoding of the PYTHONHASHSEED string; block i's digest is sha256 of
// the canonical CBOR of the array [parent digest (byte string), the block's
// token ids (array of uints), extra keys (array, or null when none)], the
// parent of block 0 being the root. Events carry the low 64 bits of each
// digest (its last 8 bytes, big-endian). A trailing partial block is not
// hashed.
//
// Extra keys per block are, in vLLM's order, the LoRA adapter's name (every
// block of a LoRA request) and the request's cache salt (the first block
// only). Multimodal inputs add keys this Hasher does not compute.
//
// A Hasher is immutable and safe for concurrent use.
type Hasher struct {
	root      [sha256.Size]byte
	blockSize int
	cbor      cbor.UserBufferEncMode
}

// HashExtras are the per-request inputs that change block hashes besides
// the tokens.
type HashExtras struct {
	// LoRAName is the LoRA adapter's name, empty for the base model.
	LoRAName string
	// CacheSalt is the request's cache_salt, empty for none.
	CacheSalt string
}

// ErrInvalidHasher reports a hasher configuration vLLM could not have.
var ErrInvalidHasher = errors.New("kvindex client: invalid hasher config")

// MaxHasherBlockSize is the largest block size, in tokens, NewHasher
// takes (engines use 16 to a few hundred); past it a block's hash input
// would not fit a buffer.
const MaxHasherBlockSize = 1 << 20

// NewHasher returns the hasher of engines started with PYTHONHASHSEED =
// pythonHashSeed (exactly the environment string, e.g. "0") and block size
// blockSize tokens, 1 to MaxHasherBlockSize. An empty seed is an error:
// without PYTHONHASHSEED vLLM seeds its root randomly per process, and
// nobody can reproduce its hashes. Errors wrap ErrInvalidHasher.
func NewHasher(pythonHashSeed string, blockSize int) (*Hasher, error) {
	if pythonHashSeed == "" {
		return nil, fmt.Errorf("%w: PYTHONHASHSEED is required (vLLM's hashes are random without it)", ErrInvalidHasher)
	}
	if blockSize <= 0 || blockSize > MaxHasherBlockSize {
		return nil, fmt.Errorf("%w: block size %d is not 1 to %d tokens", ErrInvalidHasher, blockSize, MaxHasherBlockSize)
	}
	// CBOR's core deterministic encoding (RFC 8949 §4.2.1: shortest heads,
	// definite lengths) is what Python's cbor2.dumps(..., canonical=True)
	// writes for vLLM's hash inputs.
	em, err := cbor.CoreDetEncOptions().UserBufferEncMode()
	if err != nil {
		return nil, fmt.Errorf("%w: CBOR options: %v", ErrInvalidHasher, err)
	}
	seed, err := em.Marshal(pythonHashSeed)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding PYTHONHASHSEED: %v", ErrInvalidHasher, err)
	}
	return &Hasher{root: sha256.Sum256(seed), blockSize: blockSize, cbor: em}, nil
}

// BlockSize is the block size in tokens.
func (h *Hasher) BlockSize() int { return h.blockSize }

// BlockHashes returns the 64-bit hashes of the full blocks of tokens, in
// order: what the engine's KV events carry and what Lookup takes.
func (h *Hasher) BlockHashes(tokens []uint32, extras HashExtras) []uint64 {
	return h.AppendBlockHashes(make([]uint64, 0, len(tokens)/h.blockSize), tokens, extras)
}

// AppendBlockHashes appends the 64-bit block hashes of tokens to dst.
func (h *Hasher) AppendBlockHashes(dst []uint64, tokens []uint32, extras HashExtras) []uint64 {
	h.walk(tokens, extras, func(d *[sha256.Size]byte) {
		dst = append(dst, binary.BigEndian.Uint64(d[sha256.Size-8:]))
	})
	return dst
}

// BlockDigests returns the full 32-byte digests of the full blocks.
func (h *Hasher) BlockDigests(tokens []uint32, extras HashExtras) [][sha256.Size]byte {
	out := make([][sha256.Size]byte, 0, len(tokens)/h.blockSize)
	h.walk(tokens, extras, func(d *[sha256.Size]byte) { out = append(out, *d) })
	return out
}

// blockInput is what vLLM hashes for one block: the CBOR array [parent
// digest (byte string), the block's token ids (array of uints), extra keys
// (array of text, or null when none)].
type blockInput struct {
	_      struct{} `cbor:",toarray"`
	Parent []byte
	Tokens []uint32
	Extras []string
}

// walk hashes the full blocks in order, reusing one encoding buffer.
func (h *Hasher) walk(tokens []uint32, extras HashExtras, emit func(*[sha256.Size]byte)) {
	var buf bytes.Buffer
	buf.Grow(64 + 5*h.blockSize + len(extras.LoRAName) + len(extras.CacheSalt))
	var lora, loraSalt []string
	if extras.LoRAName != "" {
		lora = []string{extras.LoRAName}
	}
	if extras.CacheSalt != "" {
		loraSalt = append(append([]string(nil), lora...), extras.CacheSalt)
	}
	parent := h.root
	var in blockInput
	for b := 0; (b+1)*h.blockSize <= len(tokens); b++ {
		in.Parent = parent[:]
		in.Tokens = tokens[b*h.blockSize : (b+1)*h.blockSize]
		in.Extras = lora // nil (CBOR null) without a LoRA adapter
		if b == 0 && loraSalt != nil {
			in.Extras = loraSalt // the cache salt belongs to the first block only
		}
		buf.Reset()
		if err := h.cbor.MarshalToBuffer(&in, &buf); err != nil {
			// Unreachable (byte strings, uint32 slices and text always
			// encode); stopping yields a shorter prefix, never a wrong
			// hash.
			return
		}
		parent = sha256.Sum256(buf.Bytes())
		emit(&parent)
	}
}

package keyspace

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/internal/tier"
)

// Keyspace v2 stores an (endpoint, tier)'s blocks in chunks: one key per
// chunk of up to DefaultChunkSize blocks, in insertion order (DESIGN
// "etcd keyspace (v2)"):
//
//	chunks/{model}/{pod}/{rank}/{tier}/{seq:016x}
//
// A chunk's value is its whole state: a one-byte entry width, then its
// entries in insertion order, each a block's key hash (big-endian uint64)
// and, at width 16, the block's engine hash after it. Width 8 is an
// endpoint in engine-hash mode, where the two hashes are one; width 16 is
// token mode, where a new owner rebuilds the engine hash → key map from
// it. The width byte makes a value decodable without its endpoint record
// and keeps `xxd -p -s1 -c16` one block per line for operators.

// Chunk value entry widths (the value's first byte).
const (
	// ChunkWidthKey is an entry of the key hash alone (engine-hash mode).
	ChunkWidthKey = 8
	// ChunkWidthKeyEngine is an entry of the key hash then the engine
	// hash (token mode).
	ChunkWidthKeyEngine = 16
)

// DefaultChunkSize is the most blocks the ingester puts in one chunk
// unless configured otherwise. The keyspace-v2 study measured 64 cheapest
// for full windows of 1,024 ops; at a fixed 50k block ops/s windows carry
// a few dozen ops per endpoint and each rewrites its chunks whole, so 24
// with the ingester's default linger grows etcd's DB by 0.24× v1 against
// 0.28× at 64 (DESIGN "Chunk size and window linger, measured").
const DefaultChunkSize = 24

// MaxChunkEntries is the most entries a reader accepts in one chunk value
// (a writer's configured chunk size may not exceed it): 256 entries of 16
// bytes keep a chunk put far below etcd's request limit.
const MaxChunkEntries = 256

// seqLen is the length of a chunk key's hex sequence segment.
const seqLen = hashLen

// MaxChunkSeq is the largest chunk sequence number a writer uses (2^63-1).
// A writer opens one chunk per 24-64 blocks, so at a million blocks a
// second it would take over a hundred thousand years to get there; a
// chunk key past it, or a chunk_next past MaxChunkSeq+1, was written by
// something else and is treated as malformed, so a writer's next sequence
// never wraps to 0 and overwrites its first chunk.
const MaxChunkSeq = 1<<63 - 1

// ChunkEntry is one block of a chunk: Key is the hash routers look up (the
// key hash), Engine the engine's own hash of the block (equal to Key in
// engine-hash mode).
type ChunkEntry struct {
	Key    uint64
	Engine uint64
}

// Chunk is one parsed chunk key: chunk Seq of Endpoint's blocks in Tier.
type Chunk struct {
	Endpoint Endpoint
	Tier     tier.Tier
	Seq      uint64
}

// ChunksPrefix is the prefix of every chunk key.
func (k Keyspace) ChunksPrefix() string { return k.prefix + sectionChunks }

// ModelChunksPrefix is the prefix of every chunk key of model.
func (k Keyspace) ModelChunksPrefix(model string) string {
	return k.prefix + sectionChunks + escape(model) + "/"
}

// EndpointChunksPrefix is the prefix of every chunk key of ep, in every
// tier: chunks/{model}/{pod}/{rank}/.
func (k Keyspace) EndpointChunksPrefix(ep Endpoint) string {
	return string(k.appendEndpointPath(nil, sectionChunks, ep))
}

// TierChunksPrefix is the prefix of every chunk key of ep in tier t:
// chunks/{model}/{pod}/{rank}/{tier}/.
func (k Keyspace) TierChunksPrefix(ep Endpoint, t tier.Tier) string {
	return k.EndpointChunksPrefix(ep) + t.String() + "/"
}

// ChunkKey is the key of chunk seq of ep's blocks in tier t.
func (k Keyspace) ChunkKey(ep Endpoint, t tier.Tier, seq uint64) string {
	return string(AppendChunkKey(nil, k.EndpointChunksPrefix(ep), t, seq))
}

// AppendChunkKey appends the key of chunk seq in tier t to dst, given the
// endpoint's EndpointChunksPrefix (writers compute the escaped prefix once
// per endpoint).
func AppendChunkKey(dst []byte, endpointPrefix string, t tier.Tier, seq uint64) []byte {
	dst = append(dst, endpointPrefix...)
	dst = append(dst, t.String()...)
	dst = append(dst, '/')
	return AppendHash(dst, seq)
}

// appendEndpointPath appends {prefix}{section}{model}/{pod}/{rank}/.
func (k Keyspace) appendEndpointPath(dst []byte, section string, ep Endpoint) []byte {
	dst = append(dst, k.prefix...)
	dst = append(dst, section...)
	return append(appendEndpoint(dst, ep), '/')
}

// appendEndpoint appends {model}/{pod}/{rank}, escaped: the one builder
// of an endpoint's segments, in the keys of every section that names one
// (endpoints/, members/, chunks/); parseEndpointPath reads them back.
func appendEndpoint(dst []byte, ep Endpoint) []byte {
	dst = append(dst, escape(ep.Model)...)
	dst = append(dst, '/')
	dst = append(dst, escape(ep.Pod)...)
	dst = append(dst, '/')
	return strconv.AppendUint(dst, uint64(ep.Rank), 10)
}

// SplitChunkKey is the allocation-free fast path of ParseChunkKey for
// readers that already know their endpoints: it returns the key's
// EndpointChunksPrefix (a substring of key), tier and sequence number. It
// validates the tier and sequence strictly but checks only the shape of
// the endpoint part; callers that meet an endpoint prefix they do not know
// must call ParseChunkKey.
func (k Keyspace) SplitChunkKey(key string) (endpointPrefix string, t tier.Tier, seq uint64, err error) {
	rest, err := k.cut(key, sectionChunks)
	if err != nil {
		return "", tier.Unknown, 0, err
	}
	// rest = {model}/{pod}/{rank}/{tier}/{seq}; walk back from the end.
	if len(rest) < seqLen+1 || rest[len(rest)-seqLen-1] != '/' {
		return "", tier.Unknown, 0, fmt.Errorf("%w: %q has no sequence segment", ErrMalformedKey, key)
	}
	if seq, err = ParseHash(rest[len(rest)-seqLen:]); err != nil {
		return "", tier.Unknown, 0, err
	}
	head := rest[:len(rest)-seqLen-1] // {model}/{pod}/{rank}/{tier}
	slash := strings.LastIndexByte(head, '/')
	if slash < 0 {
		return "", tier.Unknown, 0, fmt.Errorf("%w: %q has no tier segment", ErrMalformedKey, key)
	}
	var ok bool
	if t, ok = tier.Parse(head[slash+1:]); !ok {
		return "", tier.Unknown, 0, fmt.Errorf("%w: %q has unknown tier %q", ErrMalformedKey, key, head[slash+1:])
	}
	if strings.Count(head[:slash], "/") != 2 {
		return "", tier.Unknown, 0, fmt.Errorf("%w: %q does not have model, pod and rank segments", ErrMalformedKey, key)
	}
	return key[:len(k.prefix)+len(sectionChunks)+slash+1], t, seq, nil
}

// ParseChunkKey parses a chunk key strictly. It returns ErrMalformedKey for
// anything ChunkKey would not have produced.
func (k Keyspace) ParseChunkKey(key string) (Chunk, error) {
	endpointPrefix, t, seq, err := k.SplitChunkKey(key)
	if err != nil {
		return Chunk{}, err
	}
	ep, err := k.ParseEndpointChunksPrefix(endpointPrefix)
	if err != nil {
		return Chunk{}, err
	}
	return Chunk{Endpoint: ep, Tier: t, Seq: seq}, nil
}

// ParseEndpointChunksPrefix parses an EndpointChunksPrefix back into its
// endpoint (the inverse of EndpointChunksPrefix).
func (k Keyspace) ParseEndpointChunksPrefix(prefix string) (Endpoint, error) {
	rest, err := k.cut(prefix, sectionChunks)
	if err != nil {
		return Endpoint{}, err
	}
	path, ok := strings.CutSuffix(rest, "/")
	if !ok {
		return Endpoint{}, fmt.Errorf("%w: endpoint prefix %q does not end in '/'", ErrMalformedKey, prefix)
	}
	return k.parseEndpointPath(prefix, path)
}

// AppendChunkValue appends the value of a chunk holding entries, in their
// order, to dst: width ChunkWidthKeyEngine when withEngine (token mode),
// else ChunkWidthKey (the engine hashes are not written). An empty chunk
// has no value: writers delete its key instead.
func AppendChunkValue(dst []byte, entries []ChunkEntry, withEngine bool) []byte {
	width := byte(ChunkWidthKey)
	if withEngine {
		width = ChunkWidthKeyEngine
	}
	dst = append(dst, width)
	for _, e := range entries {
		dst = binary.BigEndian.AppendUint64(dst, e.Key)
		if withEngine {
			dst = binary.BigEndian.AppendUint64(dst, e.Engine)
		}
	}
	return dst
}

// ChunkValueLen is the length of a chunk value of n entries.
func ChunkValueLen(n int, withEngine bool) int {
	if withEngine {
		return 1 + n*ChunkWidthKeyEngine
	}
	return 1 + n*ChunkWidthKey
}

// ChunkView is a decoded chunk value that reads its entries in place,
// without copying: the zero value is an empty chunk.
type ChunkView struct {
	v     []byte
	width int
}

// ParseChunkValue checks a chunk value and returns a view of it. It
// returns ErrMalformedValue for an unknown width, a length that is not a
// whole number of entries, no entries at all, or more than
// MaxChunkEntries.
func ParseChunkValue(v []byte) (ChunkView, error) {
	if len(v) == 0 {
		return ChunkView{}, fmt.Errorf("%w: chunk value is empty", ErrMalformedValue)
	}
	width := int(v[0])
	if width != ChunkWidthKey && width != ChunkWidthKeyEngine {
		return ChunkView{}, fmt.Errorf("%w: chunk entry width %d (want %d or %d)", ErrMalformedValue, width, ChunkWidthKey, ChunkWidthKeyEngine)
	}
	body := v[1:]
	n := len(body) / width
	switch {
	case len(body)%width != 0:
		return ChunkView{}, fmt.Errorf("%w: chunk value of %d bytes is not whole %d-byte entries", ErrMalformedValue, len(body), width)
	case n == 0:
		return ChunkView{}, fmt.Errorf("%w: chunk value has no entries", ErrMalformedValue)
	case n > MaxChunkEntries:
		return ChunkView{}, fmt.Errorf("%w: chunk value has %d entries (at most %d)", ErrMalformedValue, n, MaxChunkEntries)
	}
	return ChunkView{v: body, width: width}, nil
}

// Len is the number of entries.
func (c ChunkView) Len() int {
	if c.width == 0 {
		return 0
	}
	return len(c.v) / c.width
}

// HasEngine reports whether the entries carry engine hashes (token mode).
func (c ChunkView) HasEngine() bool { return c.width == ChunkWidthKeyEngine }

// Key is entry i's key hash; it panics when i is out of range.
func (c ChunkView) Key(i int) uint64 { return binary.BigEndian.Uint64(c.v[i*c.width:]) }

// Entry is entry i; at width 8 its Engine is its Key. It panics when i is
// out of range.
func (c ChunkView) Entry(i int) ChunkEntry {
	e := ChunkEntry{Key: c.Key(i)}
	if c.width == ChunkWidthKeyEngine {
		e.Engine = binary.BigEndian.Uint64(c.v[i*c.width+8:])
	} else {
		e.Engine = e.Key
	}
	return e
}

// AppendEntries appends every entry, in order, to dst.
func (c ChunkView) AppendEntries(dst []ChunkEntry) []ChunkEntry {
	for i, n := 0, c.Len(); i < n; i++ {
		dst = append(dst, c.Entry(i))
	}
	return dst
}

package keyspace

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/internal/tier"
)

// Endpoint identifies one KV cache of one model: a model-server pod and its
// data-parallel rank, serving Model (DESIGN semantics 1: endpoint = (pod,
// data_parallel_rank); models never share entries).
type Endpoint struct {
	// Model is the served model name (the Kafka record's "model" header).
	Model string
	// Pod is the pod identity (the Kafka record key).
	Pod string
	// Rank is the data-parallel rank; a batch without one is rank 0.
	Rank uint32
}

// Validate reports ErrInvalidName when the model or pod cannot be stored.
func (e Endpoint) Validate() error {
	if err := ValidateName("model", e.Model); err != nil {
		return err
	}
	return ValidateName("pod", e.Pod)
}

// String renders the endpoint for logs as "model|pod|rank".
func (e Endpoint) String() string {
	return e.Model + "|" + e.Pod + "|" + strconv.FormatUint(uint64(e.Rank), 10)
}

// Block is one parsed block key: Hash is present on Endpoint in Tier.
type Block struct {
	Endpoint Endpoint
	Tier     tier.Tier
	Hash     uint64
}

// hashLen is the length of the hex hash segment of a block key.
const hashLen = 16

// BlocksPrefix is the prefix of every block key.
func (k Keyspace) BlocksPrefix() string { return k.prefix + sectionBlocks }

// ModelBlocksPrefix is the prefix of every block key of model.
func (k Keyspace) ModelBlocksPrefix(model string) string {
	return k.prefix + sectionBlocks + escape(model) + "/"
}

// EndpointBlocksPrefix is the prefix of every block key of ep, in every
// tier: blocks/{model}/{pod}/{rank}/. A range delete of it drops the
// endpoint's blocks (AllBlocksCleared, goodbye, resync, restarts).
func (k Keyspace) EndpointBlocksPrefix(ep Endpoint) string {
	var b strings.Builder
	b.Grow(len(k.prefix) + len(sectionBlocks) + len(ep.Model) + len(ep.Pod) + 16)
	b.WriteString(k.prefix)
	b.WriteString(sectionBlocks)
	b.WriteString(escape(ep.Model))
	b.WriteByte('/')
	b.WriteString(escape(ep.Pod))
	b.WriteByte('/')
	b.WriteString(strconv.FormatUint(uint64(ep.Rank), 10))
	b.WriteByte('/')
	return b.String()
}

// TierBlocksPrefix is the prefix of every block key of ep in tier t:
// blocks/{model}/{pod}/{rank}/{tier}/.
func (k Keyspace) TierBlocksPrefix(ep Endpoint, t tier.Tier) string {
	return k.EndpointBlocksPrefix(ep) + t.String() + "/"
}

// BlockKey is the key that records hash present on ep in tier t.
func (k Keyspace) BlockKey(ep Endpoint, t tier.Tier, hash uint64) string {
	return string(AppendBlockKey(nil, k.EndpointBlocksPrefix(ep), t, hash))
}

// AppendBlockKey appends the block key for hash in tier t to dst, given the
// endpoint's EndpointBlocksPrefix (callers that write many keys of one
// endpoint compute the escaped prefix once).
func AppendBlockKey(dst []byte, endpointPrefix string, t tier.Tier, hash uint64) []byte {
	dst = append(dst, endpointPrefix...)
	dst = append(dst, t.String()...)
	dst = append(dst, '/')
	return AppendHash(dst, hash)
}

// AppendHash appends hash as 16 lower-case hex digits, the block key's last
// segment and the form operators and fixtures use.
func AppendHash(dst []byte, hash uint64) []byte {
	const digits = "0123456789abcdef"
	var buf [hashLen]byte
	for i := hashLen - 1; i >= 0; i-- {
		buf[i] = digits[hash&0xf]
		hash >>= 4
	}
	return append(dst, buf[:]...)
}

// ParseHash parses exactly 16 lower-case hex digits.
func ParseHash(s string) (uint64, error) {
	if len(s) != hashLen {
		return 0, fmt.Errorf("%w: hash %q is not %d hex digits", ErrMalformedKey, s, hashLen)
	}
	var h uint64
	for i := 0; i < hashLen; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			h = h<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			h = h<<4 | uint64(c-'a'+10)
		default:
			return 0, fmt.Errorf("%w: hash %q is not lower-case hex", ErrMalformedKey, s)
		}
	}
	return h, nil
}

// SplitBlockKey is the allocation-free fast path of ParseBlockKey for
// readers that already know their endpoints: it returns the key's
// EndpointBlocksPrefix (a substring of key), tier and hash. It validates the
// tier and hash strictly but checks only the shape of the endpoint part
// (model, pod and rank segments present); callers that meet an endpoint
// prefix they do not know must call ParseBlockKey.
func (k Keyspace) SplitBlockKey(key string) (endpointPrefix string, t tier.Tier, hash uint64, err error) {
	rest, err := k.cut(key, sectionBlocks)
	if err != nil {
		return "", tier.Unknown, 0, err
	}
	// rest = {model}/{pod}/{rank}/{tier}/{hash}; walk back from the end.
	if len(rest) < hashLen+1 || rest[len(rest)-hashLen-1] != '/' {
		return "", tier.Unknown, 0, fmt.Errorf("%w: %q has no hash segment", ErrMalformedKey, key)
	}
	if hash, err = ParseHash(rest[len(rest)-hashLen:]); err != nil {
		return "", tier.Unknown, 0, err
	}
	head := rest[:len(rest)-hashLen-1] // {model}/{pod}/{rank}/{tier}
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
	return key[:len(k.prefix)+len(sectionBlocks)+slash+1], t, hash, nil
}

// ParseBlockKey parses a block key strictly. It returns ErrMalformedKey for
// anything BlockKey would not have produced.
func (k Keyspace) ParseBlockKey(key string) (Block, error) {
	endpointPrefix, t, hash, err := k.SplitBlockKey(key)
	if err != nil {
		return Block{}, err
	}
	ep, err := k.parseEndpointPath(key, strings.TrimSuffix(endpointPrefix[len(k.prefix)+len(sectionBlocks):], "/"))
	if err != nil {
		return Block{}, err
	}
	return Block{Endpoint: ep, Tier: t, Hash: hash}, nil
}

// ParseEndpointBlocksPrefix parses an EndpointBlocksPrefix back into its
// endpoint (the inverse of EndpointBlocksPrefix).
func (k Keyspace) ParseEndpointBlocksPrefix(prefix string) (Endpoint, error) {
	rest, err := k.cut(prefix, sectionBlocks)
	if err != nil {
		return Endpoint{}, err
	}
	path, ok := strings.CutSuffix(rest, "/")
	if !ok {
		return Endpoint{}, fmt.Errorf("%w: endpoint prefix %q does not end in '/'", ErrMalformedKey, prefix)
	}
	return k.parseEndpointPath(prefix, path)
}

// parseEndpointPath parses "{model}/{pod}/{rank}".
func (k Keyspace) parseEndpointPath(key, path string) (Endpoint, error) {
	segs, err := split(key, path, 3)
	if err != nil {
		return Endpoint{}, err
	}
	model, err := unescape("model", segs[0])
	if err != nil {
		return Endpoint{}, err
	}
	pod, err := unescape("pod", segs[1])
	if err != nil {
		return Endpoint{}, err
	}
	rank, err := parseUint32("rank", segs[2])
	if err != nil {
		return Endpoint{}, err
	}
	return Endpoint{Model: model, Pod: pod, Rank: rank}, nil
}

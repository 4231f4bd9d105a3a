package keyspace

import (
	"cmp"
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

// CompareEndpoints is the one order of endpoints: by model, then pod
// (byte-wise), then rank. ListEndpoints lists in it and its page token
// names the last endpoint of a page in it, so every replica and every
// reference model must sort the same way: they all call this.
func CompareEndpoints(a, b Endpoint) int {
	return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Pod, b.Pod), cmp.Compare(a.Rank, b.Rank))
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

// Block is one block of the index: Hash (the key hash) is present on
// Endpoint in Tier. Readers of chunk values produce it (a chunk entry with
// its chunk's endpoint and tier).
type Block struct {
	Endpoint Endpoint
	Tier     tier.Tier
	Hash     uint64
}

// hashLen is the length of a hex hash: a chunk key's sequence segment,
// and the form operators and fixtures use for block hashes.
const hashLen = 16

// AppendHash appends hash as 16 lower-case hex digits, a chunk key's last
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

// ParseHashText parses a block hash as a person or a fixture writes it:
// 1 to 16 hex digits of either case, optionally prefixed 0x or 0X (the
// lookup command's arguments, the status page's query, scenario files).
// Keys use ParseHash, which takes only the canonical 16 lower-case digits.
func ParseHashText(s string) (uint64, error) {
	d := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	v, err := strconv.ParseUint(d, 16, 64)
	if err != nil || d == "" {
		return 0, fmt.Errorf("keyspace: hash %q is not 64-bit hex", s)
	}
	return v, nil
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

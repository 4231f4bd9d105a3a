package keyspace

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the key prefix every kvindex key lives under unless
// configured otherwise.
const DefaultPrefix = "/kvindex/v2/"

// Section names: the first path element after the prefix.
const (
	sectionBlocks    = "blocks/"
	sectionChunks    = "chunks/"
	sectionEndpoints = "endpoints/"
	sectionOwners    = "owners/"
	sectionOffsets   = "offsets/"
	sectionIngesters = "ingesters/"
	sectionMembers   = "members/"
)

// Keyspace builds and parses keys under one prefix. The zero value is not
// usable; build one with New. A Keyspace is a small immutable value, safe
// to copy and to use from many goroutines.
type Keyspace struct {
	prefix string
}

// New returns the keyspace under prefix, which must be non-empty and end
// in '/' (for example DefaultPrefix). It returns ErrInvalidPrefix otherwise.
func New(prefix string) (Keyspace, error) {
	if prefix == "" || !strings.HasSuffix(prefix, "/") {
		return Keyspace{}, fmt.Errorf("%w: %q must be non-empty and end in '/'", ErrInvalidPrefix, prefix)
	}
	return Keyspace{prefix: prefix}, nil
}

// Default returns the keyspace under DefaultPrefix.
func Default() Keyspace { return Keyspace{prefix: DefaultPrefix} }

// Prefix returns the prefix every key of this keyspace starts with.
func (k Keyspace) Prefix() string { return k.prefix }

// Kind says which section a key belongs to.
type Kind uint8

// The key kinds. KindUnknown is a key under the prefix that belongs to no
// section, or a key outside the prefix. KindBlock is v1's one key per
// block: nothing writes or reads it any more, and readers that meet one
// under their prefix report an unmigrated keyspace (kvindex migrate).
const (
	KindUnknown Kind = iota
	KindBlock
	KindEndpoint
	KindOwner
	KindOffset
	KindIngester
	KindMember
	KindChunk
)

// KindCount is one more than the largest Kind, for arrays indexed by Kind.
const KindCount = KindChunk + 1

// String returns the section name of the kind.
func (k Kind) String() string {
	switch k {
	case KindBlock:
		return "blocks"
	case KindEndpoint:
		return "endpoints"
	case KindOwner:
		return "owners"
	case KindOffset:
		return "offsets"
	case KindIngester:
		return "ingesters"
	case KindMember:
		return "members"
	case KindChunk:
		return "chunks"
	}
	return "unknown"
}

// KindOf says which section key belongs to by its section name alone; it
// does not validate the rest of the key (the Parse functions do).
func (k Keyspace) KindOf(key string) Kind {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if !ok {
		return KindUnknown
	}
	switch {
	case strings.HasPrefix(rest, sectionBlocks):
		return KindBlock
	case strings.HasPrefix(rest, sectionEndpoints):
		return KindEndpoint
	case strings.HasPrefix(rest, sectionOwners):
		return KindOwner
	case strings.HasPrefix(rest, sectionOffsets):
		return KindOffset
	case strings.HasPrefix(rest, sectionIngesters):
		return KindIngester
	case strings.HasPrefix(rest, sectionMembers):
		return KindMember
	case strings.HasPrefix(rest, sectionChunks):
		return KindChunk
	}
	return KindUnknown
}

// cut removes the keyspace prefix and section from key, or reports a
// malformed key naming the section it expected.
func (k Keyspace) cut(key, section string) (string, error) {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if ok {
		rest, ok = strings.CutPrefix(rest, section)
	}
	if !ok {
		return "", fmt.Errorf("%w: %q is not under %s%s", ErrMalformedKey, key, k.prefix, section)
	}
	return rest, nil
}

// RangeEnd returns the etcd range end that covers every key starting with
// prefix (what clientv3.GetPrefixRangeEnd computes), for range reads and
// deletes of a section or an endpoint.
func RangeEnd(prefix string) string {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	// Every byte is 0xff: the range runs to the end of the keyspace.
	return "\x00"
}

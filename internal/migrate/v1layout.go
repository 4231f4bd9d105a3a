package migrate

import (
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/tier"
)

// The v1 block layout, private to this package: the one place kvindex
// still knows it. v1 kept one key per (block, endpoint, tier),
//
//	{prefix}blocks/{model}/{pod}/{rank}/{tier}/{hash:016x}
//
// with the value empty in engine-hash mode and, in token mode, the
// block's engine hash as 16 lower-case hex digits. Every other section
// (endpoints/, members/, owners/, offsets/, ingesters/) has the same
// layout in v1 and v2, so those are read with package keyspace under the
// v1 prefix.

// v1SectionBlocks is the v1 block section.
const v1SectionBlocks = "blocks/"

// v1BlocksPrefix is the prefix of every v1 block key.
func v1BlocksPrefix(ks keyspace.Keyspace) string { return ks.Prefix() + v1SectionBlocks }

// v1EndpointBlocksPrefix is the prefix of ep's v1 block keys in every
// tier: blocks/{model}/{pod}/{rank}/. The endpoint path is the endpoint
// key's, so its escaping is keyspace's.
func v1EndpointBlocksPrefix(ks keyspace.Keyspace, ep keyspace.Endpoint) string {
	return v1BlocksPrefix(ks) + strings.TrimPrefix(ks.EndpointKey(ep), ks.EndpointsPrefix()) + "/"
}

// v1ParseBlockKey parses a v1 block key under endpointPrefix (ep's
// v1EndpointBlocksPrefix) into its tier and hash. Anything a v1 writer
// would not have produced is keyspace.ErrMalformedKey.
func v1ParseBlockKey(endpointPrefix, key string) (tier.Tier, uint64, error) {
	rest, ok := strings.CutPrefix(key, endpointPrefix)
	name, hash, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 {
		return tier.Unknown, 0, fmt.Errorf("%w: %q is not {tier}/{hash} under %q", keyspace.ErrMalformedKey, key, endpointPrefix)
	}
	t, ok := tier.Parse(name)
	if !ok {
		return tier.Unknown, 0, fmt.Errorf("%w: %q has unknown tier %q", keyspace.ErrMalformedKey, key, name)
	}
	h, err := keyspace.ParseHash(hash)
	if err != nil {
		return tier.Unknown, 0, err
	}
	return t, h, nil
}

// v1ParseEngineHash parses a v1 token-mode block value: the engine hash
// as exactly 16 lower-case hex digits (the key hash's own form).
func v1ParseEngineHash(v []byte) (uint64, error) {
	h, err := keyspace.ParseHash(string(v))
	if err != nil {
		return 0, fmt.Errorf("%w: engine hash %q is not 16 lower-case hex digits", keyspace.ErrMalformedValue, v)
	}
	return h, nil
}

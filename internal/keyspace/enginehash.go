package keyspace

import "fmt"

// ParseHashMode parses a hash mode as the ingester's --hash-mode flag and
// the endpoint record's hash_mode field spell it: "token" or "engine".
func ParseHashMode(s string) (HashMode, error) {
	switch m := HashMode(s); m {
	case HashModeToken, HashModeEngine:
		return m, nil
	}
	return "", fmt.Errorf("keyspace: unknown hash mode %q (want %q or %q)", s, HashModeToken, HashModeEngine)
}

// EngineHashLen is the length of a token-mode block value: the engine's
// own hash of the block as 16 lowercase hex digits (DESIGN "etcd
// keyspace").
const EngineHashLen = 16

// AppendEngineHash appends the token-mode block value of engine hash h, 16
// lowercase hex digits, to dst.
func AppendEngineHash(dst []byte, h uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[(h>>uint(shift))&0xf])
	}
	return dst
}

// ParseEngineHash parses a token-mode block value: exactly 16 lowercase
// hex digits. Anything else (an engine-hash mode block's empty value
// included) is ErrMalformedValue.
func ParseEngineHash(v []byte) (uint64, error) {
	if len(v) != EngineHashLen {
		return 0, fmt.Errorf("%w: engine hash %q is not %d hex digits", ErrMalformedValue, v, EngineHashLen)
	}
	var h uint64
	for _, c := range v {
		switch {
		case c >= '0' && c <= '9':
			h = h<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			h = h<<4 | uint64(c-'a'+10)
		default:
			return 0, fmt.Errorf("%w: engine hash %q is not lowercase hex", ErrMalformedValue, v)
		}
	}
	return h, nil
}

package keyspace

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxNameLen bounds the byte length of a model, pod, topic or ingester id.
// Longer names are rejected with ErrInvalidName: a key carries its names,
// and etcd keeps every key in memory.
const MaxNameLen = 512

// ValidateName reports whether s can be stored as a name segment: non-empty,
// valid UTF-8 and at most MaxNameLen bytes. what names the field in the
// error ("model", "pod", ...).
func ValidateName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidName, what)
	case len(s) > MaxNameLen:
		return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrInvalidName, what, len(s), MaxNameLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidName, what, s)
	}
	return nil
}

// escape is the one escaping rule of the keyspace (DESIGN: url.PathEscape,
// exactly).
func escape(s string) string { return url.PathEscape(s) }

// unescape parses one escaped segment and insists it is the canonical
// escape of a valid name, so a name has exactly one key.
func unescape(what, seg string) (string, error) {
	s, err := url.PathUnescape(seg)
	if err != nil {
		return "", fmt.Errorf("%w: %s segment %q: %v", ErrMalformedKey, what, seg, err)
	}
	if escape(s) != seg {
		return "", fmt.Errorf("%w: %s segment %q is not canonically escaped", ErrMalformedKey, what, seg)
	}
	if err := ValidateName(what, s); err != nil {
		return "", fmt.Errorf("%w: %v", ErrMalformedKey, err)
	}
	return s, nil
}

// parseUint32 parses a canonical decimal (no sign, no leading zeros).
func parseUint32(what, s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || strconv.FormatUint(v, 10) != s {
		return 0, fmt.Errorf("%w: %s %q is not a canonical decimal", ErrMalformedKey, what, s)
	}
	return uint32(v), nil
}

// parseInt32 parses a canonical non-negative decimal that fits an int32.
func parseInt32(what, s string) (int32, error) {
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v < 0 || strconv.FormatInt(v, 10) != s {
		return 0, fmt.Errorf("%w: %s %q is not a canonical non-negative decimal", ErrMalformedKey, what, s)
	}
	return int32(v), nil
}

// split cuts rest into exactly n '/'-separated segments.
func split(key, rest string, n int) ([]string, error) {
	segs := strings.Split(rest, "/")
	if len(segs) != n {
		return nil, fmt.Errorf("%w: %q has %d segments after its section, want %d", ErrMalformedKey, key, len(segs), n)
	}
	return segs, nil
}

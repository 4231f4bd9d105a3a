package index

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is. indexd
// counts and skips the events that return them (kvindex_indexd_malformed_total);
// they never reach a caller of indexd.
var (
	// ErrFull reports that an internal limit of the index (2^28 endpoints,
	// 2^31 words of endpoint sets) was reached; the caller counts and
	// skips the event.
	ErrFull = errors.New("index: full")
	// ErrMalformedValue reports a stored value under the prefix that does
	// not decode (an endpoint record or an offset); the caller counts and
	// skips the event.
	ErrMalformedValue = errors.New("index: malformed value")
)

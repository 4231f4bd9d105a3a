package keyspace

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is.
var (
	// ErrMalformedKey reports a key that is not under the prefix or does
	// not follow the schema.
	ErrMalformedKey = errors.New("keyspace: malformed key")
	// ErrInvalidName reports a model, pod, topic or ingester id that cannot
	// be stored: empty, not UTF-8, or longer than MaxNameLen bytes.
	ErrInvalidName = errors.New("keyspace: invalid name")
	// ErrInvalidPrefix reports a key prefix that is empty or does not end
	// in '/'.
	ErrInvalidPrefix = errors.New("keyspace: invalid prefix")
	// ErrMalformedValue reports a stored value that does not decode.
	ErrMalformedValue = errors.New("keyspace: malformed value")
)

package events

import "errors"

// ErrMalformedBatch is wrapped by every error that rejects a whole payload.
var ErrMalformedBatch = errors.New("events: malformed batch")

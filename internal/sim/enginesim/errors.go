package enginesim

import "errors"

// Sentinel errors; wrapped with detail, test them with errors.Is.
var (
	// ErrInvalidConfig reports a Config that Validate rejects.
	ErrInvalidConfig = errors.New("enginesim: invalid config")
	// ErrClosed reports a call on an Engine after Close.
	ErrClosed = errors.New("enginesim: engine closed")
)

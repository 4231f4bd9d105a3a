package cellmap

import "errors"

// Sentinel errors.
var (
	// ErrInvalid: a cell map that does not parse or breaks a rule of the
	// format; the message names the line.
	ErrInvalid = errors.New("cellmap: invalid cell map")
	// ErrNoCell: a model no rule matches, in a map without a default.
	ErrNoCell = errors.New("cellmap: no cell for model")
)

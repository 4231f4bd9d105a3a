package common

import (
	"errors"
	"fmt"
)

// ErrUsage is wrapped by every UsageError: bad command-line input.
var ErrUsage = errors.New("usage")

// UsageError is bad command-line input: a flag out of range, a missing or
// malformed argument. The process exits with status 2 for it (the
// ExitCode method, read by cli.ExitCode), as for cobra's own unknown
// flags, and 1 for every other failure.
type UsageError struct{ err error }

// Error returns the message, naming the flag or argument.
func (e UsageError) Error() string { return e.err.Error() }

// Unwrap returns the error it was made from and ErrUsage.
func (e UsageError) Unwrap() []error { return []error{e.err, ErrUsage} }

// ExitCode is 2.
func (UsageError) ExitCode() int { return 2 }

// Usagef returns a UsageError formatted as fmt.Errorf formats (%w wraps).
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

package common

import (
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// FlagNames returns err with its text reading in flags instead of Go
// field names: each exported field of *cfg that a flag of fs is bound to
// (registered with fs.IntVar(&cfg.Field, ...) and the like, so the flag's
// value is the field's own memory) is replaced, as a whole word, by
// "--flag". A library Config's Validate names its fields ("MaxTxnBytes
// 100: want between 16 KiB and 1.5 MiB"); the command's user set a flag
// and should read its name. Fields no flag sets (those the command fills
// in itself) keep their names. The result wraps err, so errors.Is still
// finds the library's sentinel, and, when it names a flag, is a usage
// error (exit status 2); nil stays nil. cfg must be a non-nil
// pointer to a struct, else err is returned as it is.
func FlagNames(err error, fs *pflag.FlagSet, cfg any) error {
	if err == nil {
		return nil
	}
	names := BoundFields(fs, cfg)
	if len(names) == 0 {
		return err
	}
	fields := make([]string, 0, len(names))
	for f := range names {
		fields = append(fields, regexp.QuoteMeta(f))
	}
	// Longest first, so a field whose name begins another's does not win.
	slices.SortFunc(fields, func(a, b string) int { return len(b) - len(a) })
	re := regexp.MustCompile(`\b(` + strings.Join(fields, "|") + `)\b`)
	msg := re.ReplaceAllStringFunc(err.Error(), func(f string) string { return "--" + names[f] })
	if msg == err.Error() {
		return err
	}
	return &flagNamedError{msg: msg, err: err}
}

// BoundFields maps the exported fields of *cfg that a flag of fs is bound
// to (the flag's value shares the field's memory) to their flag names. A
// field with several flags gets the first in fs's order. cfg must be a
// non-nil pointer to a struct; anything else maps nothing.
func BoundFields(fs *pflag.FlagSet, cfg any) map[string]string {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	s := v.Elem()
	byAddr := map[uintptr]string{}
	for i := range s.NumField() {
		f := s.Type().Field(i)
		if !f.IsExported() || f.Type.Size() == 0 {
			continue // a zero-size field shares its address with the next
		}
		// The first field shares the struct's address; a flag bound to
		// the whole struct is not one of its fields' flags.
		byAddr[s.Field(i).Addr().Pointer()] = f.Name
	}
	out := map[string]string{}
	fs.VisitAll(func(fl *pflag.Flag) {
		for _, p := range valueAddrs(fl.Value) {
			if name, ok := byAddr[p]; ok {
				if _, seen := out[name]; !seen {
					out[name] = fl.Name
				}
				return
			}
		}
	})
	return out
}

// valueAddrs returns the memory a flag's value may be bound to: the value
// itself when it is a pointer (pflag's scalar values are the bound
// variable's own memory, converted: *intValue is the *int), and the
// pointer fields of the struct it points to (pflag's slice values hold
// the bound *[]T in a field).
func valueAddrs(v pflag.Value) []uintptr {
	p := reflect.ValueOf(v)
	if p.Kind() != reflect.Pointer || p.IsNil() {
		return nil
	}
	out := []uintptr{p.Pointer()}
	if s := p.Elem(); s.Kind() == reflect.Struct {
		for i := range s.NumField() {
			if f := s.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
				out = append(out, f.Pointer())
			}
		}
	}
	return out
}

// flagNamedError is an error whose text FlagNames rewrote: it names the
// flags the user set, so it is bad usage (exit status 2, as UsageError)
// and wraps ErrUsage besides the library's error.
type flagNamedError struct {
	msg string
	err error
}

func (e *flagNamedError) Error() string   { return e.msg }
func (e *flagNamedError) Unwrap() []error { return []error{e.err, ErrUsage} }
func (e *flagNamedError) ExitCode() int   { return 2 }

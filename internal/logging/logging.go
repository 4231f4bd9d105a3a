// Package logging builds kvindex's slog loggers and adapts the loggers of
// its dependencies (etcd's zap, franz-go's kgo and kfake loggers) to slog in
// one place, so every line a kvindex process prints has one format.
package logging

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Format is a log output format.
type Format string

// The formats New accepts.
const (
	FormatText Format = "text"
	FormatJSON Format = "json"
)

// ErrLevel and ErrFormat are the errors New wraps for a level or a format
// it does not know, so a command can name its flag (--log-level,
// --log-format).
var (
	ErrLevel  = errors.New("logging: unknown level")
	ErrFormat = errors.New("logging: unknown format")
)

// New returns a logger writing to w at level in format ("text" or "json").
// level is a slog level name, any case: debug, info, warn or error. An
// unknown level wraps ErrLevel and an unknown format ErrFormat, each
// error quoting the bad value.
func New(w io.Writer, level string, format Format) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("%w %q: want debug, info, warn or error", ErrLevel, level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case FormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w %q: want text or json", ErrFormat, format)
}

// Discard returns a logger that drops everything (for tests and benches).
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

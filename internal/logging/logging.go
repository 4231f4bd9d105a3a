// Package logging builds kvindex's slog loggers and adapts the loggers of
// its dependencies (etcd's zap, franz-go's kgo and kfake loggers) to slog in
// one place, so every line a kvindex process prints has one format.
package logging

import (
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

// New returns a logger writing to w at level in format ("text" or "json").
// It returns an error naming the bad value for anything else.
func New(w io.Writer, level string, format Format) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("logging: level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case FormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("logging: format %q: want text or json", format)
}

// Discard returns a logger that drops everything (for tests and benches).
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

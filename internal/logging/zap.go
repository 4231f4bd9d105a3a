package logging

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger that forwards every entry to l, mapping zap's
// levels to slog's (DPanic and above become Error) and its fields to
// attributes. Embedded etcd logs through it.
func Zap(l *slog.Logger) *zap.Logger {
	return zap.New(&zapCore{h: l.Handler()})
}

type zapCore struct {
	h     slog.Handler
	attrs []slog.Attr
}

func zapLevel(lv zapcore.Level) slog.Level {
	switch {
	case lv <= zapcore.DebugLevel:
		return slog.LevelDebug
	case lv == zapcore.InfoLevel:
		return slog.LevelInfo
	case lv == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (c *zapCore) Enabled(lv zapcore.Level) bool {
	return c.h.Enabled(context.Background(), zapLevel(lv))
}

func (c *zapCore) With(fields []zapcore.Field) zapcore.Core {
	attrs := append(append([]slog.Attr(nil), c.attrs...), fieldAttrs(fields)...)
	return &zapCore{h: c.h, attrs: attrs}
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, zapLevel(e.Level), e.Message, 0)
	r.AddAttrs(c.attrs...)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(fieldAttrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *zapCore) Sync() error { return nil }

// fieldAttrs converts zap fields to slog attributes through zap's own map
// encoder, so every field type renders as zap would.
func fieldAttrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	return attrs
}

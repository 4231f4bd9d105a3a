package logging

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// Kgo returns a franz-go client logger writing to l (franz-go's own slog
// plugin).
func Kgo(l *slog.Logger) kgo.Logger { return kslog.New(l) }

// Kfake returns a logger for the in-process Kafka broker writing to l.
func Kfake(l *slog.Logger) kfake.Logger { return kfakeLogger{l} }

type kfakeLogger struct{ l *slog.Logger }

func (k kfakeLogger) Logf(lv kfake.LogLevel, format string, args ...any) {
	var level slog.Level
	switch lv {
	case kfake.LogLevelDebug:
		level = slog.LevelDebug
	case kfake.LogLevelInfo:
		level = slog.LevelInfo
	case kfake.LogLevelWarn:
		level = slog.LevelWarn
	case kfake.LogLevelError:
		level = slog.LevelError
	default:
		return
	}
	ctx := context.Background()
	if !k.l.Enabled(ctx, level) {
		return
	}
	k.l.Log(ctx, level, "kafka broker", "msg", fmt.Sprintf(format, args...))
}

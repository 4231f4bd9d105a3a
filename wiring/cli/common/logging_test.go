package common

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/logging"
)

// TestLoggingNamesFlag: a level or format the logger does not know is an
// error naming the flag that set it, and still wraps logging's sentinel.
func TestLoggingNamesFlag(t *testing.T) {
	for _, tc := range []struct {
		name          string
		level, format string
		want          string
		is            error
	}{
		{name: "bad_level", level: "loud", format: "text", want: `--log-level: logging: unknown level "loud"`, is: logging.ErrLevel},
		{name: "bad_format", level: "info", format: "xml", want: `--log-format: logging: unknown format "xml"`, is: logging.ErrFormat},
		{name: "both_good", level: "WARN", format: "json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Logging{Level: tc.level, Format: tc.format}
			log, err := l.LoggerTo(io.Discard)
			if tc.want == "" {
				if err != nil || log == nil {
					t.Fatalf("LoggerTo = %v, %v; want a logger", log, err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Fatalf("LoggerTo error = %v, want one starting %q wrapping %v", err, tc.want, tc.is)
			}
		})
	}
}

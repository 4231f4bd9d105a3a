package common

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/contract"
)

func TestCheckPositive(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "defaults", args: nil},
		{name: "positive_values", args: []string{"--n=3", "--p=1", "--d=1ms", "--u=2"}},
		{name: "zero_int", args: []string{"--n=0"}, wantErr: "--n must be positive, got 0"},
		{name: "negative_int32", args: []string{"--p=-5"}, wantErr: "--p must be positive, got -5"},
		{name: "zero_duration", args: []string{"--d=0"}, wantErr: "--d must be positive, got 0s"},
		{name: "negative_duration", args: []string{"--d=-1s"}, wantErr: "--d must be positive, got -1s"},
		{name: "zero_uint", args: []string{"--u=0"}, wantErr: "--u must be positive, got 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			fs.Int("n", 1, "")
			fs.Int32("p", 4, "")
			fs.Duration("d", time.Second, "")
			fs.Uint("u", 1, "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := CheckPositive(fs, "n", "p", "d", "u")
			if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Fatalf("CheckPositive = %v, want %q", err, tc.wantErr)
			}
		})
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("s", "x", "")
	for _, name := range []string{"missing", "s"} {
		if err := CheckPositive(fs, name); err == nil {
			t.Errorf("CheckPositive(--%s) = nil, want an error", name)
		}
	}
}

// TestCheckNonNegative: zero passes (a documented default), a negative
// value is refused naming the flag.
func TestCheckNonNegative(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "zeros", args: []string{"--n=0", "--d=0", "--u=0"}},
		{name: "positive_values", args: []string{"--n=3", "--d=1ms", "--u=2"}},
		{name: "negative_int", args: []string{"--n=-1"}, wantErr: "--n must be zero or positive, got -1"},
		{name: "negative_duration", args: []string{"--d=-1ms"}, wantErr: "--d must be zero or positive, got -1ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			fs.Int("n", 1, "")
			fs.Duration("d", time.Second, "")
			fs.Uint("u", 1, "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := CheckNonNegative(fs, "n", "d", "u")
			if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Fatalf("CheckNonNegative = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidateTopic(t *testing.T) {
	for _, tc := range []struct {
		name    string
		topic   string
		wantErr string
	}{
		{name: "default", topic: contract.DefaultTopic},
		{name: "every_allowed_character", topic: "Az09._-"},
		{name: "longest", topic: strings.Repeat("t", MaxTopicLen)},
		{name: "empty", topic: "", wantErr: "empty"},
		{name: "too_long", topic: strings.Repeat("t", MaxTopicLen+1), wantErr: "limit is 249"},
		{name: "dot", topic: ".", wantErr: "not allowed"},
		{name: "dot_dot", topic: "..", wantErr: "not allowed"},
		{name: "space_and_slash", topic: "bad topic/x", wantErr: `' ' at byte 3`},
		{name: "non_ascii", topic: "tópico", wantErr: "only ASCII letters"},
		{name: "control_character", topic: "a\nb", wantErr: `'\n'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateTopic(tc.topic)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ValidateTopic(%q) = %v, want %q", tc.topic, err, tc.wantErr)
			}
		})
	}
	k := Kafka{Topic: "bad topic"}
	if err := k.ValidateTopic(); err == nil || !strings.HasPrefix(err.Error(), "--topic: ") {
		t.Fatalf("Kafka.ValidateTopic = %v, want an error naming --topic", err)
	}
}

package common

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

// flagNamesConfig stands for a library Config: some fields bound to
// flags, one a prefix of another's name, one set by the command itself.
type flagNamesConfig struct {
	Lease     int
	LeaseTTL  time.Duration
	Mode      string
	Brokers   []string // no flag: the command fills it in
	Endpoints []string
}

var errFlagNamesInvalid = errors.New("invalid config")

func flagNamesSet(c *flagNamesConfig) *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.IntVar(&c.Lease, "lease-count", c.Lease, "")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "")
	fs.StringVar(&c.Mode, "hash-mode", c.Mode, "")
	fs.StringSliceVar(&c.Endpoints, "etcd-endpoints", nil, "")
	fs.Int("unbound", 0, "")
	return fs
}

func TestBoundFields(t *testing.T) {
	var c flagNamesConfig
	got := BoundFields(flagNamesSet(&c), &c)
	want := map[string]string{"Lease": "lease-count", "LeaseTTL": "lease-ttl", "Mode": "hash-mode", "Endpoints": "etcd-endpoints"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("BoundFields (-want +got):\n%s", diff)
	}
	if got := BoundFields(flagNamesSet(&c), c); got != nil {
		t.Errorf("BoundFields of a struct value = %v, want nil", got)
	}
	if got := BoundFields(flagNamesSet(&c), (*flagNamesConfig)(nil)); got != nil {
		t.Errorf("BoundFields of a nil pointer = %v, want nil", got)
	}
}

func TestFlagNames(t *testing.T) {
	var c flagNamesConfig
	fs := flagNamesSet(&c)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"one field", "LeaseTTL 1.5s: want a whole number of seconds", "--lease-ttl 1.5s: want a whole number of seconds"},
		{"a prefix of another field", "Lease 0: want at least 1", "--lease-count 0: want at least 1"},
		{"two fields", "LeaseTTL 1s: want more than Lease 3", "--lease-ttl 1s: want more than --lease-count 3"},
		{"a field no flag sets", "Brokers are required", "Brokers are required"},
		{"not a whole word", "Modes and LeaseTTLs", "Modes and LeaseTTLs"},
		{"quoted", `Mode "x": want token or engine`, `--hash-mode "x": want token or engine`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := FlagNames(fmt.Errorf("%w: %s", errFlagNamesInvalid, tc.in), fs, &c)
			if got, want := err.Error(), "invalid config: "+tc.want; got != want {
				t.Errorf("FlagNames = %q, want %q", got, want)
			}
			if !errors.Is(err, errFlagNamesInvalid) {
				t.Errorf("FlagNames(%q) does not wrap the sentinel", tc.in)
			}
		})
	}
	if err := FlagNames(nil, fs, &c); err != nil {
		t.Errorf("FlagNames(nil) = %v", err)
	}
	orig := errors.New("LeaseTTL 0s")
	if err := FlagNames(orig, fs, c); err != orig {
		t.Errorf("FlagNames with a struct value = %v, want the error unchanged", err)
	}
}

package common

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/logging"
)

// CheckPositive returns an error naming the first of the named flags of fs
// whose value is zero or negative, so a flag never silently means "the
// default" (the library Configs may still read zero as the default). It
// reads int, uint and duration flags of any width; a name fs lacks, or of
// another type, is an error too (a programming mistake, caught by tests).
func CheckPositive(fs *pflag.FlagSet, names ...string) error {
	return checkSign(fs, "positive", func(n int64) bool { return n > 0 }, names)
}

// CheckNonNegative is CheckPositive for flags whose zero is documented
// (a default or "off"): it names the first of them with a negative value.
func CheckNonNegative(fs *pflag.FlagSet, names ...string) error {
	return checkSign(fs, "zero or positive", func(n int64) bool { return n >= 0 }, names)
}

// checkSign returns an error naming the first flag of names whose value
// ok refuses (an unsigned flag is refused only at zero, by CheckPositive).
func checkSign(fs *pflag.FlagSet, want string, ok func(int64) bool, names []string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			return fmt.Errorf("checking flags: no flag --%s", name)
		}
		v := f.Value.String()
		var good bool
		switch f.Value.Type() {
		case "int", "int8", "int16", "int32", "int64":
			n, err := strconv.ParseInt(v, 10, 64)
			good = err == nil && ok(n)
		case "uint", "uint8", "uint16", "uint32", "uint64":
			n, err := strconv.ParseUint(v, 10, 64)
			good = err == nil && (n > 0 || ok(0))
		case "duration":
			d, err := time.ParseDuration(v)
			good = err == nil && ok(int64(d))
		default:
			return fmt.Errorf("checking flags: --%s is a %s flag", name, f.Value.Type())
		}
		if !good {
			return Usagef("--%s must be %s, got %s", name, want, v)
		}
	}
	return nil
}

// MaxTopicLen is the longest Kafka topic name (Kafka's own limit).
const MaxTopicLen = cellmap.MaxTopicLen

// ValidateTopic reports a name Kafka would refuse as a topic
// (cellmap.ValidateTopic: the one rule, which cell maps' topics follow
// too).
func ValidateTopic(name string) error { return cellmap.ValidateTopic(name) }

// ValidateTopic checks --topic with the package function ValidateTopic:
// a usage error (exit 2) naming the flag.
func (k *Kafka) ValidateTopic() error {
	if err := ValidateTopic(k.Topic); err != nil {
		return Usagef("--topic: %w", err)
	}
	return nil
}

// ValidateBrokers refuses, as a usage error (exit 2), an empty --brokers
// entry ("--brokers ','" splits into two) and entries that carry
// credentials ("user:password@host:9092"): Kafka clients ignore them
// (SASL is the way: --kafka-sasl-*), and an address that reaches an error
// message or a log must not show a password. The error shows the entry
// redacted. No entry at all is the caller's to judge (replay's embedded
// stack takes none).
func (k *Kafka) ValidateBrokers() error {
	for _, b := range k.Brokers {
		if strings.TrimSpace(b) == "" {
			return Usagef("--brokers has an empty entry (%q): name each broker as host:port, comma separated", strings.Join(k.Brokers, ","))
		}
		if r := logging.RedactURL(b); r != b {
			return Usagef("--brokers: %s carries credentials, which Kafka clients ignore: use --kafka-sasl-mechanism, --kafka-sasl-username and --kafka-sasl-password-file", r)
		}
	}
	return nil
}

package common

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/internal/logging"
)

// AddressFlags are the flags, in any command, that name addresses to dial:
// indexd (--index), the engine's ZMQ sockets (--zmq, --replay), Kafka
// (--brokers) and etcd (--etcd-endpoints). None of their clients uses
// user information in an address (gRPC, ZMQ and Kafka have no place for
// it; etcd's client ignores it), so an address carrying some is refused,
// and every address shown, in an error, a log line or a --help default,
// goes through logging.RedactAddress first. TLS file paths are not
// addresses and stay as they are.
var AddressFlags = []string{"index", "zmq", "replay", "brokers", "etcd-endpoints"}

// credentialsHint says, per flag, what to use instead of credentials in
// the address.
var credentialsHint = map[string]string{
	"index":          "indexd authenticates clients by TLS certificate (--tls-cert-file, --tls-key-file)",
	"zmq":            "ZMQ has no credentials",
	"replay":         "ZMQ has no credentials",
	"brokers":        "use --kafka-sasl-mechanism, --kafka-sasl-username and --kafka-sasl-password-file",
	"etcd-endpoints": "use --etcd-username and --etcd-password-file",
}

// CheckAddressFlags refuses an address flag of fs (AddressFlags) whose
// value carries user information ("user:password@host:port", with or
// without a scheme), naming the flag and showing the value redacted.
func CheckAddressFlags(fs *pflag.FlagSet) error {
	for _, name := range AddressFlags {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		for _, v := range flagValues(f) {
			if r := logging.RedactAddress(v); r != v {
				return fmt.Errorf("--%s: %s carries credentials, which are not used in an address: %s", name, r, credentialsHint[name])
			}
		}
	}
	return nil
}

// RedactFlagDefaults redacts the --help defaults of fs's address flags.
func RedactFlagDefaults(fs *pflag.FlagSet) {
	for _, name := range AddressFlags {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if inner, ok := strings.CutPrefix(f.DefValue, "["); ok && strings.HasSuffix(inner, "]") {
			// A slice flag's default, as pflag prints it: [a,b].
			f.DefValue = "[" + logging.RedactAddress(strings.TrimSuffix(inner, "]")) + "]"
			continue
		}
		f.DefValue = logging.RedactAddress(f.DefValue)
	}
}

// flagValues returns a flag's addresses: each element of a slice flag,
// else the value split at commas.
func flagValues(f *pflag.Flag) []string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return sv.GetSlice()
	}
	return strings.Split(f.Value.String(), ",")
}

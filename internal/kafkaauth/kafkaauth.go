// Package kafkaauth holds the Kafka security flags that every kvindex
// command talking to Kafka shares (ingester, bridge, replay --brokers):
// TLS (--kafka-tls-ca-file, --kafka-tls-cert-file, --kafka-tls-key-file,
// --kafka-tls-server-name) and SASL (--kafka-sasl-mechanism PLAIN,
// SCRAM-SHA-256 or SCRAM-SHA-512, --kafka-sasl-username,
// --kafka-sasl-password-file), turned into franz-go client options with
// franz-go's own SASL mechanisms (pkg/sasl/plain, pkg/sasl/scram).
//
// The password is read from its file at every SASL handshake (each new
// broker connection), so a rotated Secret is used with no restart, and it
// is never logged or put in an error. The client certificate is re-read
// when its files change (internal/tlsfiles); the CA bundle is read once.
package kafkaauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/kvindex/kvindex/internal/tlsfiles"
)

// The SASL mechanisms Config.SASLMechanism accepts (Kafka's names).
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// ErrInvalid wraps every error of a bad flag combination.
var ErrInvalid = errors.New("kafkaauth: invalid Kafka security flags")

// Config is the Kafka security of one client. The zero value is
// plaintext without SASL, Kafka's default listener.
type Config struct {
	// TLSCAFile is the PEM CA bundle verifying the brokers. Empty: the
	// system roots (when TLS is on).
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are the PEM client certificate for
	// brokers with mutual TLS (ssl.client.auth=required); both or neither.
	TLSCertFile, TLSKeyFile string
	// TLSServerName is the name the brokers' certificates must carry.
	// Empty: each broker's host as dialled (franz-go's default).
	TLSServerName string
	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (case
	// insensitive). Empty: no SASL.
	SASLMechanism string
	// SASLUsername and SASLPasswordFile are the SASL credentials;
	// required with SASLMechanism and refused without it. The file is
	// read at every handshake, with one trailing newline dropped.
	SASLUsername, SASLPasswordFile string
}

// Register adds the flags to fs, writing into c.
func (c *Config) Register(fs *pflag.FlagSet) {
	fs.StringVar(&c.TLSCAFile, "kafka-tls-ca-file", "", "PEM CA bundle that verifies the Kafka brokers; any --kafka-tls-* flag turns TLS on (default roots: the system's)")
	fs.StringVar(&c.TLSCertFile, "kafka-tls-cert-file", "", "PEM client certificate for brokers with mutual TLS (with --kafka-tls-key-file; re-read when it changes)")
	fs.StringVar(&c.TLSKeyFile, "kafka-tls-key-file", "", "PEM private key of --kafka-tls-cert-file")
	fs.StringVar(&c.TLSServerName, "kafka-tls-server-name", "", "name the brokers' certificates must carry (default: each broker's host)")
	fs.StringVar(&c.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: no SASL)")
	fs.StringVar(&c.SASLUsername, "kafka-sasl-username", "", "SASL user (with --kafka-sasl-mechanism)")
	fs.StringVar(&c.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL user's password, read at every connection (one trailing newline ignored; never logged)")
}

// TLS reports whether any TLS setting is given (TLS is then on).
func (c Config) TLS() bool {
	return c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != "" || c.TLSServerName != ""
}

// Validate reports a bad combination, wrapping ErrInvalid: an unknown
// mechanism, a mechanism without username or password file (or those
// without a mechanism), a certificate without its key (or the reverse).
// It reads no file.
func (c Config) Validate() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fmt.Errorf("%w: --kafka-tls-cert-file and --kafka-tls-key-file go together", ErrInvalid)
	}
	if c.SASLMechanism == "" {
		if c.SASLUsername != "" || c.SASLPasswordFile != "" {
			return fmt.Errorf("%w: --kafka-sasl-username and --kafka-sasl-password-file need --kafka-sasl-mechanism", ErrInvalid)
		}
		return nil
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512:
	default:
		return fmt.Errorf("%w: --kafka-sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", ErrInvalid, c.SASLMechanism)
	}
	if c.SASLUsername == "" || c.SASLPasswordFile == "" {
		return fmt.Errorf("%w: --kafka-sasl-mechanism %s needs --kafka-sasl-username and --kafka-sasl-password-file", ErrInvalid, c.SASLMechanism)
	}
	return nil
}

// Opts validates c and returns the franz-go options it describes (none
// for the zero Config): kgo.DialTLSConfig with TLS on, kgo.SASL with a
// mechanism. It errors when a file cannot be read now (the password file
// too, so a typo fails at startup rather than at the first connection).
// log receives a warning for PLAIN without TLS and certificate reloads.
func (c Config) Opts(log *slog.Logger) ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var opts []kgo.Opt
	if c.TLS() {
		cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: c.TLSCAFile, CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ServerName: c.TLSServerName}, log)
		if err != nil {
			return nil, fmt.Errorf("%w (--kafka-tls-ca-file, --kafka-tls-cert-file, --kafka-tls-key-file)", err)
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if c.SASLMechanism == "" {
		return opts, nil
	}
	if _, err := readPassword(c.SASLPasswordFile); err != nil {
		return nil, err
	}
	mech := strings.ToUpper(c.SASLMechanism)
	if mech == MechanismPlain && !c.TLS() {
		log.Warn("SASL PLAIN without TLS sends the password in the clear; set --kafka-tls-ca-file (or another --kafka-tls-* flag)")
	}
	opts = append(opts, kgo.SASL(c.mechanism(mech)))
	return opts, nil
}

// mechanism builds the SASL mechanism, reading the password at each use.
func (c Config) mechanism(mech string) sasl.Mechanism {
	user, file := c.SASLUsername, c.SASLPasswordFile
	scramAuth := func(context.Context) (scram.Auth, error) {
		pw, err := readPassword(file)
		return scram.Auth{User: user, Pass: pw}, err
	}
	switch mech {
	case MechanismSCRAMSHA256:
		return scram.Sha256(scramAuth)
	case MechanismSCRAMSHA512:
		return scram.Sha512(scramAuth)
	}
	return plain.Plain(func(context.Context) (plain.Auth, error) {
		pw, err := readPassword(file)
		return plain.Auth{User: user, Pass: pw}, err
	})
}

// readPassword reads a password file, dropping one trailing "\n" or
// "\r\n". Its errors name the file, never its content.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--kafka-sasl-password-file: %w", err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("--kafka-sasl-password-file: %s holds an empty password", path)
	}
	return s, nil
}

package kafkaauth

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tlsfiles"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testutil.LeakOptions()...) }

const (
	topic = "kvindex-events"
	group = "kvindex-ingester"
)

// ACLs is the least a deployment grants each kvindex principal
// (docs/security.md, "Kafka ACLs"): producers write the topic, the
// ingesters read it and use their group. Read and Write imply Describe
// in Kafka; it is granted explicitly so the list reads the same in
// kafka-acls commands.
var (
	producerACLs = []kfake.ACL{
		{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationWrite, Allow: true},
		{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true},
	}
	ingesterACLs = []kfake.ACL{
		{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true},
		{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true},
		{Resource: kmsg.ACLResourceTypeGroup, Name: group, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationRead, Allow: true},
		{Resource: kmsg.ACLResourceTypeGroup, Name: group, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationDescribe, Allow: true},
	}
)

// secureKafka is a kfake cluster with mutual TLS, SASL and ACLs on, and
// the files a client needs.
type secureKafka struct {
	brokers []string
	ca      *testcerts.CA
	client  testcerts.Pair
	dir     string
}

func startSecureKafka(t *testing.T) *secureKafka {
	t.Helper()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kafka")
	srv := ca.Issue(t, "broker", "127.0.0.1", "kafka.kvindex.svc")
	tlsCfg, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := testutil.StartKafka(t, topic, 2,
		kfake.TLS(tlsCfg), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(MechanismSCRAMSHA512, "admin", "admin-password"),
		kfake.User(MechanismSCRAMSHA256, "bridge", "bridge-password", producerACLs...),
		kfake.User(MechanismPlain, "replay", "replay-password", producerACLs...),
		kfake.User(MechanismSCRAMSHA512, "ingester", "ingester-password", ingesterACLs...),
	)
	return &secureKafka{brokers: k.Brokers, ca: ca, client: ca.Issue(t, "kvindex-client"), dir: dir}
}

// config is the Config of user authenticating with password by mech.
func (k *secureKafka) config(t *testing.T, mech, user, password string) Config {
	t.Helper()
	pw := filepath.Join(k.dir, user+"-password")
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{
		TLSCAFile: k.ca.File, TLSCertFile: k.client.CertFile, TLSKeyFile: k.client.KeyFile,
		SASLMechanism: mech, SASLUsername: user, SASLPasswordFile: pw,
	}
}

func (k *secureKafka) newClient(t *testing.T, c Config, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts, err := c.Opts(nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(k.brokers...), kgo.RecordRetries(2), kgo.RetryTimeout(2 * time.Second)}, opts...), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produce(t *testing.T, cl *kgo.Client, value string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(10*time.Second))
	defer cancel()
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("vllm-0"), Value: []byte(value)}).FirstErr()
}

// ping asks a broker for metadata: it fails fast on a refused
// connection, with franz-go's explanation.
func ping(t *testing.T, cl *kgo.Client) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(5*time.Second))
	defer cancel()
	return cl.Ping(ctx)
}

// consume reads as a group member until it sees want, or returns the
// first error the client reports.
func consume(t *testing.T, k *secureKafka, c Config, want string) error {
	t.Helper()
	cl := k.newClient(t, c, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(15*time.Second))
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return ferr
		}
		for _, r := range fs.Records() {
			if string(r.Value) == want {
				return nil
			}
		}
	}
}

// TestACLs checks the ACLs docs/security.md lists against kfake with
// mutual TLS, SASL and ACLs on: each principal can do its part, and
// nothing else.
func TestACLs(t *testing.T) {
	k := startSecureKafka(t)
	bridge := k.config(t, MechanismSCRAMSHA256, "bridge", "bridge-password")
	replay := k.config(t, MechanismPlain, "replay", "replay-password")
	ingester := k.config(t, MechanismSCRAMSHA512, "ingester", "ingester-password")

	if err := produce(t, k.newClient(t, bridge), "from-bridge"); err != nil {
		t.Fatalf("the bridge (SCRAM-SHA-256) producing: %v", err)
	}
	if err := produce(t, k.newClient(t, replay), "from-replay"); err != nil {
		t.Fatalf("replay (PLAIN) producing: %v", err)
	}
	if err := consume(t, k, ingester, "from-bridge"); err != nil {
		t.Fatalf("the ingester (SCRAM-SHA-512) consuming in its group: %v", err)
	}
	t.Run("ingester_cannot_produce", func(t *testing.T) {
		err := produce(t, k.newClient(t, ingester), "forged")
		// The idempotent producer's InitProducerID is refused first (it
		// needs Write on some topic); without it, the produce would be.
		if !errors.Is(err, kerrClusterAuth) && !errors.Is(err, kerrTopicAuth) {
			t.Fatalf("produce as the ingester: %v, want an authorization failure", err)
		}
	})
	t.Run("producer_cannot_consume", func(t *testing.T) {
		err := consume(t, k, bridge, "from-bridge")
		if !errors.Is(err, kerrGroupAuth) && !errors.Is(err, kerrTopicAuth) {
			t.Fatalf("consume as the bridge: %v, want an authorization failure", err)
		}
	})
	t.Run("ingester_other_group_refused", func(t *testing.T) {
		cl := k.newClient(t, ingester, kgo.ConsumerGroup("another-group"), kgo.ConsumeTopics(topic))
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(15*time.Second))
		defer cancel()
		var ferr error
		for ferr == nil && ctx.Err() == nil {
			cl.PollFetches(ctx).EachError(func(_ string, _ int32, err error) { ferr = err })
		}
		if !errors.Is(ferr, kerrGroupAuth) {
			t.Fatalf("joining another group: %v, want GROUP_AUTHORIZATION_FAILED", ferr)
		}
	})
}

// TestAuthenticationRefused: without the right password, without SASL,
// without TLS or without a client certificate, a client gets nothing from
// the broker.
func TestAuthenticationRefused(t *testing.T) {
	k := startSecureKafka(t)
	good := k.config(t, MechanismSCRAMSHA256, "bridge", "bridge-password")
	wrong := k.config(t, MechanismSCRAMSHA256, "bridge-wrong", "not-the-password")
	wrong.SASLUsername = "bridge"
	noSASL := good
	noSASL.SASLMechanism, noSASL.SASLUsername, noSASL.SASLPasswordFile = "", "", ""
	noTLS := good
	noTLS.TLSCAFile, noTLS.TLSCertFile, noTLS.TLSKeyFile = "", "", ""
	noCert := good
	noCert.TLSCertFile, noCert.TLSKeyFile = "", ""
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string // "" for success; any error when "*"
	}{
		{name: "all_right", cfg: good},
		{name: "wrong_password", cfg: wrong, wantErr: "*"},
		{name: "no_sasl", cfg: noSASL, wantErr: "SASL"},
		{name: "plaintext", cfg: noTLS, wantErr: "TLS"},
		{name: "no_client_certificate", cfg: noCert, wantErr: "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ping(t, k.newClient(t, tc.cfg))
			if (err == nil) != (tc.wantErr == "") || (err != nil && tc.wantErr != "*" && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("ping: %v, want %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "not-the-password") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}

// TestPasswordFileReadAtEveryConnection: a password rotated in its file
// is used by the next connection, with no new client.
func TestPasswordFileReadAtEveryConnection(t *testing.T) {
	k := startSecureKafka(t)
	c := k.config(t, MechanismSCRAMSHA256, "bridge", "stale-password")
	cl := k.newClient(t, c)
	if err := ping(t, cl); err == nil {
		t.Fatal("a stale password was accepted")
	}
	if err := os.WriteFile(c.SASLPasswordFile, []byte("bridge-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ping(t, cl); err != nil {
		t.Fatalf("after the file was fixed: %v", err)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero_is_plaintext", cfg: Config{}},
		{name: "plain", cfg: Config{SASLMechanism: "plain", SASLUsername: "u", SASLPasswordFile: pw}},
		{name: "scram_256", cfg: Config{SASLMechanism: MechanismSCRAMSHA256, SASLUsername: "u", SASLPasswordFile: pw}},
		{name: "scram_512", cfg: Config{SASLMechanism: MechanismSCRAMSHA512, SASLUsername: "u", SASLPasswordFile: pw}},
		{name: "unknown_mechanism", cfg: Config{SASLMechanism: "GSSAPI", SASLUsername: "u", SASLPasswordFile: pw}, wantErr: `"GSSAPI"`},
		{name: "mechanism_without_user", cfg: Config{SASLMechanism: MechanismPlain, SASLPasswordFile: pw}, wantErr: "needs --kafka-sasl-username"},
		{name: "user_without_mechanism", cfg: Config{SASLUsername: "u"}, wantErr: "need --kafka-sasl-mechanism"},
		{name: "cert_without_key", cfg: Config{TLSCertFile: "c.pem"}, wantErr: "go together"},
		{name: "missing_password_file", cfg: Config{SASLMechanism: MechanismPlain, SASLUsername: "u", SASLPasswordFile: filepath.Join(dir, "nope")}, wantErr: "--kafka-sasl-password-file"},
		{name: "empty_password", cfg: Config{SASLMechanism: MechanismPlain, SASLUsername: "u", SASLPasswordFile: empty}, wantErr: "empty password"},
		{name: "missing_ca", cfg: Config{TLSCAFile: filepath.Join(dir, "nope.pem")}, wantErr: "--kafka-tls-ca-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			_, err := tc.cfg.Opts(slog.New(slog.NewTextHandler(&logs, nil)))
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Opts = %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(logs.String()+errString(err), "secret-value") {
				t.Fatalf("the password leaked: err %v, logs %s", err, logs.String())
			}
			if tc.name == "plain" && !strings.Contains(logs.String(), "without TLS") {
				t.Fatalf("PLAIN without TLS logged no warning: %q", logs.String())
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

var (
	kerrTopicAuth   = kerr.TopicAuthorizationFailed
	kerrGroupAuth   = kerr.GroupAuthorizationFailed
	kerrClusterAuth = kerr.ClusterAuthorizationFailed
)

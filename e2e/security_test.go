package e2e

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

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/etcdembed"
	"github.com/kvindex/kvindex/internal/ingesttest"
	"github.com/kvindex/kvindex/internal/kafkaauth"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
	"github.com/kvindex/kvindex/internal/sim/enginesim"
	"github.com/kvindex/kvindex/internal/testcerts"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/internal/tlsfiles"
	"github.com/kvindex/kvindex/wiring/cli/common"
	"github.com/kvindex/kvindex/wiring/replay"
)

// The etcd roles docs/security.md gives ("etcd roles"), on the default
// prefix: the ingesters read and write it, indexd only reads it.
const (
	ingesterRole = "kvindex-ingester"
	indexdRole   = "kvindex-indexd"
)

// setUpEtcdAuth creates the two roles, a user for each, a root user and
// foreign data (a lease with a key outside the prefix, a plain key
// outside it), then turns authentication on. It runs as the root client,
// before auth is on.
func setUpEtcdAuth(t *testing.T, root *clientv3.Client, prefix, ingesterPassword string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(30*time.Second))
	defer cancel()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	must(root.RoleAdd(ctx, ingesterRole))
	must(root.RoleGrantPermission(ctx, ingesterRole, prefix, end, clientv3.PermissionType(clientv3.PermReadWrite)))
	must(root.RoleAdd(ctx, indexdRole))
	must(root.RoleGrantPermission(ctx, indexdRole, prefix, end, clientv3.PermissionType(clientv3.PermRead)))
	// The ingester logs in with a password; indexd with its client
	// certificate alone (etcd takes the user from its common name).
	must(root.UserAdd(ctx, "kvindex-ingester", ingesterPassword))
	must(root.UserGrantRole(ctx, "kvindex-ingester", ingesterRole))
	must(root.UserAddWithOptions(ctx, "kvindex-indexd", "", &clientv3.UserAddOptions{NoPassword: true}))
	must(root.UserGrantRole(ctx, "kvindex-indexd", indexdRole))
	must(root.UserAddWithOptions(ctx, "root", "", &clientv3.UserAddOptions{NoPassword: true}))
	must(root.UserGrantRole(ctx, "root", "root"))

	// Another application's data: a lease whose key the kvindex roles
	// may not read (so listing every lease of the cluster is refused to
	// them), and a plain key.
	l, err := root.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	must(root.Put(ctx, "/other-app/session", "x", clientv3.WithLease(l.ID)))
	must(root.Put(ctx, "/other-app/config", "secret"))
	must(root.AuthEnable(ctx))
}

// Kafka principals of the test and the least ACLs each gets
// (docs/security.md, "Kafka ACLs").
func kafkaACLs(ops map[kmsg.ACLResourceType][]kmsg.ACLOperation, group string) []kfake.ACL {
	var out []kfake.ACL
	for res, list := range ops {
		name := topic
		if res == kmsg.ACLResourceTypeGroup {
			name = group
		}
		for _, op := range list {
			out = append(out, kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true})
		}
	}
	return out
}

func writeSecret(t *testing.T, dir, name, value string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSecuredPipeline runs the whole pipeline with every protection on:
// etcd with client-certificate TLS and RBAC (the ingester's read-write
// role and indexd's read-only role, nothing wider), Kafka with mutual
// TLS, SASL/SCRAM and ACLs (the producer may only produce, the ingester
// may only consume in its group), and indexd with mutual TLS. Scenario
// fixtures replayed through it give the answers they expect, a real
// bridge's batches reach the index, and each principal is refused what
// its role does not cover.
func TestSecuredPipeline(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "kvindex")
	ks := keyspace.Default()
	const ingesterPassword = "ingester-etcd-password-7f3a"

	// etcd: TLS with client certificates required, then RBAC.
	etcdPair := ca.Issue(t, "etcd", "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Minute))
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Config{
		DataDir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:0", UnsafeNoFsync: true,
		TLSCertFile: etcdPair.CertFile, TLSKeyFile: etcdPair.KeyFile, TLSClientCAFile: ca.File,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.ClientURL(), "https://") {
		t.Fatalf("etcd serves %s, want https", srv.ClientURL())
	}
	etcdFlags := func(cn, user, passwordFile string) *common.Etcd {
		pair := ca.Issue(t, cn)
		return &common.Etcd{Endpoints: srv.Endpoints(), Prefix: ks.Prefix(), DialTimeout: testutil.Timeout(20 * time.Second),
			CACert: ca.File, Cert: pair.CertFile, Key: pair.KeyFile, Username: user, PasswordFile: passwordFile}
	}
	dial := func(f *common.Etcd) *clientv3.Client {
		t.Helper()
		cli, err := f.Client(ctx, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	root := dial(etcdFlags("root", "", ""))
	setUpEtcdAuth(t, root, ks.Prefix(), ingesterPassword)
	// The ingester's certificate names no etcd user: only its password
	// gives it a role.
	ingesterEtcd := dial(etcdFlags("ingester-pod", "kvindex-ingester", writeSecret(t, dir, "etcd-password", ingesterPassword)))
	indexdEtcd := dial(etcdFlags("kvindex-indexd", "", ""))

	// Kafka: mutual TLS, SASL and ACLs.
	kafkaPair := ca.Issue(t, "kafka", "127.0.0.1")
	kafkaTLS, err := tlsfiles.Server(tlsfiles.ServerFiles{CertFile: kafkaPair.CertFile, KeyFile: kafkaPair.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	topicOps := kmsg.ACLResourceTypeTopic
	k := testutil.StartKafka(t, topic, 2, kfake.GroupMinSessionTimeout(time.Second),
		kfake.TLS(kafkaTLS), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(kafkaauth.MechanismSCRAMSHA512, "admin", "admin-password"),
		kfake.User(kafkaauth.MechanismSCRAMSHA256, "bridge", "bridge-kafka-password",
			kafkaACLs(map[kmsg.ACLResourceType][]kmsg.ACLOperation{topicOps: {kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe}}, "")...),
		kfake.User(kafkaauth.MechanismSCRAMSHA512, "ingester", "ingester-kafka-password",
			kafkaACLs(map[kmsg.ACLResourceType][]kmsg.ACLOperation{
				topicOps:                  {kmsg.ACLOperationRead, kmsg.ACLOperationDescribe},
				kmsg.ACLResourceTypeGroup: {kmsg.ACLOperationRead, kmsg.ACLOperationDescribe},
			}, contract.DefaultGroup)...),
	)
	kafkaClient := ca.Issue(t, "kafka-client")
	kafkaOpts := func(mech, user, password string) []kgo.Opt {
		t.Helper()
		opts, err := kafkaauth.Config{
			TLSCAFile: ca.File, TLSCertFile: kafkaClient.CertFile, TLSKeyFile: kafkaClient.KeyFile,
			SASLMechanism: mech, SASLUsername: user, SASLPasswordFile: writeSecret(t, dir, user+"-kafka-password", password),
		}.Opts(nil)
		if err != nil {
			t.Fatal(err)
		}
		return opts
	}

	// The ingester, on its role and its Kafka principal.
	icfg := ingester.DefaultConfig()
	icfg.Etcd, icfg.Keyspace, icfg.Brokers, icfg.Topic, icfg.ID = ingesterEtcd, ks, k.Brokers, topic, "secured-0"
	icfg.SessionTimeout, icfg.RebalanceTimeout, icfg.LeaseTTL, icfg.LivenessWindow = 2*time.Second, 3*time.Second, 30*time.Second, time.Hour
	icfg.KafkaOptions = kafkaOpts(kafkaauth.MechanismSCRAMSHA512, "ingester", "ingester-kafka-password")
	icfg.HashMode = keyspace.HashModeEngine // the p* fixtures name engine hashes
	ing, err := ingester.New(icfg)
	if err != nil {
		t.Fatal(err)
	}
	ingRun := start(t, ing.Run)

	// indexd, on its read-only role, serving mutual TLS.
	indexdPair := ca.Issue(t, "indexd", "127.0.0.1")
	serverTLS := common.ServerTLS{CertFile: indexdPair.CertFile, KeyFile: indexdPair.KeyFile, ClientCAFile: ca.File}
	xcfg := indexd.DefaultConfig()
	xcfg.Etcd, xcfg.Keyspace, xcfg.ListenAddr = indexdEtcd, ks, "127.0.0.1:0"
	if xcfg.TLS, err = serverTLS.Config(nil); err != nil {
		t.Fatal(err)
	}
	x, err := indexd.New(xcfg)
	if err != nil {
		t.Fatal(err)
	}
	start(t, x.Run)

	router := ca.Issue(t, "router")
	routerTLS := common.ClientTLS{CAFile: ca.File, CertFile: router.CertFile, KeyFile: router.KeyFile}
	copts, err := routerTLS.Options()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := client.New(x.Addr().String(), append(copts, client.WithTimeout(testutil.Timeout(30*time.Second)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	prod, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...), kgo.RecordRetries(10)},
		kafkaOpts(kafkaauth.MechanismSCRAMSHA256, "bridge", "bridge-kafka-password")...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()

	for _, file := range []string{"p01_shared_prefix.jsonl", "p04_all_blocks_cleared.jsonl", "p11_goodbye_resync_heartbeat.jsonl"} {
		s, err := scenario.Load(filepath.Join(testutil.RepoRoot(t), "testdata", "fixtures", "scenarios", file))
		if err != nil {
			t.Fatal(err)
		}
		res, err := replay.Run(ctx, replay.Target{Producer: prod, Topic: topic, Index: idx}, s)
		if err != nil || len(res.Mismatches) > 0 {
			t.Fatalf("replaying %s through the secured pipeline: %v %+v", file, err, res.Mismatches)
		}
	}

	t.Run("roles_cover_nothing_else", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			op   func() error
		}{
			{name: "ingester_reads_outside_prefix", op: func() error { _, err := ingesterEtcd.Get(ctx, "/other-app/config"); return err }},
			{name: "ingester_writes_outside_prefix", op: func() error { _, err := ingesterEtcd.Put(ctx, "/other-app/x", "y"); return err }},
			{name: "ingester_lists_every_lease", op: func() error { _, err := ingesterEtcd.Leases(ctx); return err }},
			{name: "indexd_writes_in_prefix", op: func() error { _, err := indexdEtcd.Put(ctx, ks.Prefix()+"forged", "y"); return err }},
			{name: "indexd_reads_outside_prefix", op: func() error { _, err := indexdEtcd.Get(ctx, "/other-app/config"); return err }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tc.op(); !errors.Is(err, rpctypes.ErrPermissionDenied) {
					t.Fatalf("error %v, want permission denied", err)
				}
			})
		}
	})
	t.Run("unknown_etcd_identity_refused", func(t *testing.T) {
		stranger := dial(etcdFlags("stranger", "", ""))
		if _, err := stranger.Get(ctx, ks.Prefix(), clientv3.WithPrefix()); err == nil {
			t.Fatal("a certificate naming no etcd user read the index")
		}
	})
	t.Run("wrong_etcd_password_refused_and_not_shown", func(t *testing.T) {
		var logs bytes.Buffer
		f := etcdFlags("ingester-pod", "kvindex-ingester", writeSecret(t, dir, "wrong-password", "wrong-password-9c1e"))
		cli, err := f.Client(ctx, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		if err == nil {
			_, err = cli.Get(ctx, ks.Prefix(), clientv3.WithPrefix())
			cli.Close()
		}
		if err == nil {
			t.Fatal("a wrong password read the index")
		}
		if strings.Contains(err.Error()+logs.String(), "wrong-password-9c1e") {
			t.Fatalf("the password shows in the error or logs: %v\n%s", err, logs.String())
		}
	})
	t.Run("plaintext_and_certificateless_index_clients_refused", func(t *testing.T) {
		for _, opts := range [][]client.Option{nil, {client.WithTLSCAFile(ca.File)}} {
			c, err := client.New(x.Addr().String(), append(opts, client.WithTimeout(testutil.Timeout(2*time.Second)), client.WithMaxAttempts(1))...)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Lookup(ctx, "m", []uint64{1})
			c.Close()
			if !errors.Is(err, client.ErrUnavailable) {
				t.Fatalf("Lookup: %v, want ErrUnavailable", err)
			}
		}
	})
	t.Run("bridge_produces_over_tls_and_scram", func(t *testing.T) {
		// A real bridge between a simulated engine and the secured Kafka:
		// its batches reach the index through the ingester and indexd.
		eng, err := enginesim.New(enginesim.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		ep := keyspace.Endpoint{Model: "secured-bridge-model", Pod: "default/vllm-secured"}
		bcfg := bridgeConfig(eng, k.Brokers, ep)
		bcfg.KafkaOptions = kafkaOpts(kafkaauth.MechanismSCRAMSHA256, "bridge", "bridge-kafka-password")
		br := startBridge(t, ctx, bcfg, eng, 1, true)
		defer br.Stop()
		work := enginesim.NewWorkload(7, workloadConfig)
		for range 3 {
			if _, err := eng.Publish(ctx, work.Next().MustEncode()); err != nil {
				t.Fatal(err)
			}
		}
		ingesttest.WaitFor(t, ctx, root, ks.Prefix(), "the bridge's endpoint in indexd", func() bool {
			list, err := idx.ListEndpoints(ctx, ep.Model)
			if err != nil {
				t.Fatalf("ListEndpoints: %v", err)
			}
			return len(list.Endpoints) == 1 && list.Endpoints[0].Endpoint.Pod == ep.Pod
		})
	})
	t.Run("ingester_stops_cleanly_on_its_role", func(t *testing.T) {
		ingRun.stop(t) // fails the test if Run returns an error
	})
}

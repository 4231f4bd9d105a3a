package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	cryptotls "crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/wiring/cli/common"
)

// serverCertNamesMarker precedes, in deploy/README.md, the fenced block of
// names etcd's server certificate must carry.
const serverCertNamesMarker = "<!-- etcd-server-cert-names -->"

// readServerCertNames returns the names of README.md's block, with
// <namespace> replaced.
func readServerCertNames(readme, namespace string) ([]string, error) {
	data, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	_, rest, ok := bytes.Cut(data, []byte(serverCertNamesMarker))
	if !ok {
		return nil, fmt.Errorf("%s has no %s block", readme, serverCertNamesMarker)
	}
	sc := bufio.NewScanner(bytes.NewReader(rest))
	var names []string
	fences := 0
	for sc.Scan() && fences < 2 {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```"):
			fences++
		case fences == 1 && line != "":
			names = append(names, strings.ReplaceAll(line, "<namespace>", namespace))
		case fences == 0 && line != "":
			return nil, fmt.Errorf("%s: text between the marker and its block: %q", readme, line)
		}
	}
	if fences < 2 || len(names) == 0 {
		return nil, fmt.Errorf("%s: the %s block is empty or unterminated", readme, serverCertNamesMarker)
	}
	return names, sc.Err()
}

// testPKI is a CA and the two certificates deploy/README.md asks for:
// etcd's server certificate (server and client auth, the documented
// names) and the roles' client certificate (client auth).
type testPKI struct {
	caPEM                []byte
	serverCert           *x509.Certificate
	serverPEM, serverKey []byte
	clientPEM, clientKey []byte
}

func newTestPKI(t *testing.T, serverNames []string) *testPKI {
	t.Helper()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kvindex-etcd-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, cn string, names []string, usages ...x509.ExtKeyUsage) (*x509.Certificate, []byte, []byte) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usages,
		}
		for _, n := range names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return cert, pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER)
	}
	p := &testPKI{caPEM: pemBlock("CERTIFICATE", caDER)}
	p.serverCert, p.serverPEM, p.serverKey = issue(2, "kvindex-etcd", serverNames, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	_, p.clientPEM, p.clientKey = issue(3, "kvindex", nil, x509.ExtKeyUsageClientAuth)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// localPath writes the content of the Secret key that the container's
// path file holds (resolveSecretFile), taken from secrets (Secret name ->
// key -> content), under dir, and returns where.
func localPath(t *testing.T, dir string, w *workload, c *corev1.Container, file string, secrets map[string]map[string][]byte) string {
	t.Helper()
	sf, err := resolveSecretFile(w, c, file)
	if err != nil {
		t.Fatalf("%s container %s: %v", w, c.Name, err)
	}
	content, ok := secrets[sf.Secret][sf.Key]
	if !ok {
		t.Fatalf("%s container %s: %s is key %s of Secret %s, which the test does not issue", w, c.Name, file, sf.Key, sf.Secret)
	}
	local := filepath.Join(dir, sf.Volume.Name, filepath.FromSlash(sf.Rel))
	if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return local
}

// TestEtcdMutualTLS runs each TLS build's configuration for real: an etcd
// member started from the member's own parsed configuration (its TLS
// settings, client-cert-auth, file paths mapped to where the test writes
// the Secrets' keys), certificates issued as deploy/README.md documents
// them, and each role's etcd flags as its container gives them. Every role
// must get through; a client without a certificate must not; and the
// documented server certificate must cover every endpoint the roles dial.
func TestEtcdMutualTLS(t *testing.T) {
	var ran int
	for _, b := range okBuilds(t) {
		etcds := byComponent(b, "etcd")
		if len(etcds) != 1 {
			continue
		}
		members, _ := etcdMembers(t, b, etcds[0])
		if len(members) == 0 || members[0].Cfg.ClientTLSInfo.Empty() {
			continue
		}
		ran++
		t.Run(b.Dir, func(t *testing.T) { runMutualTLS(t, b, etcds[0]) })
	}
	if ran == 0 {
		t.Fatal("no build serves etcd's client port over TLS (overlays/prod-tls should)")
	}
}

func runMutualTLS(t *testing.T, b *build, w *workload) {
	names, err := readServerCertNames(filepath.Join(deployRoot, "README.md"), w.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	pki := newTestPKI(t, names)
	c := etcdContainer(w)
	pod := w.PodNames()[0]
	env, _ := envResolver{b: b, w: w, podName: pod}.resolve(c)
	args, _ := expandAll(c.Args, env)
	cfg, err := parseEtcdConfig(args, env)
	if err != nil {
		t.Fatal(err)
	}
	serverFile, err := resolveSecretFile(w, c, cfg.ClientTLSInfo.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	kcs, _ := kvContainers(b)
	var clientSecret string
	for _, k := range kcs {
		if f := k.Flags["etcd-key"]; f != "" {
			if sf, err := resolveSecretFile(k.W, k.C, f); err == nil {
				clientSecret = sf.Secret
			}
		}
	}
	if clientSecret == "" || clientSecret == serverFile.Secret {
		t.Fatalf("no role reads a client Secret of its own (found %q, etcd's is %q)", clientSecret, serverFile.Secret)
	}
	secrets := map[string]map[string][]byte{
		serverFile.Secret: {"ca.crt": pki.caPEM, "tls.crt": pki.serverPEM, "tls.key": pki.serverKey},
		clientSecret:      {"ca.crt": pki.caPEM, "tls.crt": pki.clientPEM, "tls.key": pki.clientKey},
	}

	// The member, as configured, on loopback.
	dir := t.TempDir()
	tls := &cfg.ClientTLSInfo
	tls.CertFile = localPath(t, filepath.Join(dir, "etcd"), w, c, tls.CertFile, secrets)
	tls.KeyFile = localPath(t, filepath.Join(dir, "etcd"), w, c, tls.KeyFile, secrets)
	tls.TrustedCAFile = localPath(t, filepath.Join(dir, "etcd"), w, c, tls.TrustedCAFile, secrets)
	cfg.Dir = filepath.Join(dir, "data")
	cfg.UnsafeNoFsync = true
	// Port 0: etcd binds free ports itself, and the test reads the client
	// port back from its listener. (A one-member cluster never dials its
	// peer URL, so the advertised port 0 there is never used.)
	client := url.URL{Scheme: "https", Host: "127.0.0.1:0"}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenMetricsUrls, cfg.ListenClientHttpUrls = nil, nil
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ClusterState = embed.ClusterStateFlagNew
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcd with the build's TLS settings: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatal(err)
	case <-time.After(testutil.Timeout(30 * time.Second)):
		t.Fatal("etcd did not become ready")
	}
	client.Host = e.Clients[0].Addr().String()

	// The documented names cover what the roles dial.
	for _, k := range kcs {
		for _, ep := range strings.Split(k.Flags["etcd-endpoints"], ",") {
			if ep == "" {
				continue
			}
			u, err := url.Parse(ep)
			if err != nil {
				t.Fatal(err)
			}
			if err := pki.serverCert.VerifyHostname(u.Hostname()); err != nil {
				t.Errorf("%s: dials %s, which the server certificate README.md documents does not cover: %v", k, ep, err)
			}
		}
	}

	// dial connects the way the roles do (common.Etcd) and writes and reads
	// a key.
	dial := func(e common.Etcd) error {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(10*time.Second))
		defer cancel()
		e.Endpoints = []string{client.String()}
		e.Prefix = "/kvindex/v2/"
		cli, err := e.Client(ctx, logging.Discard())
		if err != nil {
			return err
		}
		defer cli.Close()
		if _, err := cli.Put(ctx, "/kvindex/v2/tls-check", "ok"); err != nil {
			return err
		}
		_, err = cli.Get(ctx, "/kvindex/v2/tls-check")
		return err
	}
	var roles int
	for _, k := range kcs {
		if k.Flags["etcd-endpoints"] == "" {
			continue
		}
		roles++
		t.Run(k.Role, func(t *testing.T) {
			local := map[string]string{}
			for flag := range etcdTLSFlags {
				if f := k.Flags[flag]; f != "" {
					local[flag] = localPath(t, filepath.Join(dir, k.W.Name), k.W, k.C, f, secrets)
				}
			}
			err := dial(common.Etcd{DialTimeout: testutil.Timeout(5 * time.Second), CACert: local["etcd-cacert"], Cert: local["etcd-cert"], Key: local["etcd-key"]})
			if err != nil {
				t.Fatalf("with its flags %v: %v", local, err)
			}
		})
	}
	if roles == 0 {
		t.Fatal("no role dials etcd")
	}
	// etcdctl inside a member: the server certificate as a client one.
	t.Run("etcdctl_in_member", func(t *testing.T) {
		if err := dial(common.Etcd{DialTimeout: testutil.Timeout(5 * time.Second), CACert: tls.TrustedCAFile, Cert: tls.CertFile, Key: tls.KeyFile}); err != nil {
			t.Fatalf("the server certificate as a client certificate: %v", err)
		}
	})
	t.Run("no_client_certificate", func(t *testing.T) {
		// A TLS 1.3 client finishes its handshake before the server has
		// checked the client's certificate; the refusal is the server's
		// alert, read as the first response.
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pki.caPEM)
		conn, err := cryptotls.DialWithDialer(&net.Dialer{Timeout: testutil.Timeout(5 * time.Second)}, "tcp", client.Host,
			&cryptotls.Config{RootCAs: pool, ServerName: "localhost"})
		if err == nil {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(testutil.Timeout(5 * time.Second)))
			_, err = conn.Read(make([]byte, 1))
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Fatalf("a client without a certificate: %v, want etcd to refuse it (certificate required)", err)
		}
	})
	t.Run("plaintext", func(t *testing.T) {
		e := common.Etcd{DialTimeout: time.Second, Endpoints: []string{"http://" + client.Host}}
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout(2*time.Second))
		defer cancel()
		cli, err := e.Client(ctx, logging.Discard())
		if err == nil {
			_, err = cli.Get(ctx, "x")
			cli.Close()
		}
		if err == nil {
			t.Fatal("etcd answered a plaintext client on its TLS port")
		}
	})
}

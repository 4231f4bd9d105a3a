package deploy

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/version"
	etcdflags "go.etcd.io/etcd/pkg/v3/flags"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// etcdImage is the image the etcd StatefulSet must run: the etcd release
// kvindex is built and tested against (go.mod).
var etcdImage = "quay.io/coreos/etcd:v" + version.Version

// etcdMember is one etcd pod's configuration, parsed and validated by etcd
// itself.
type etcdMember struct {
	PodName string
	Cfg     *embed.Config
	Env     map[string]string
}

// parseEtcdConfig builds etcd's configuration from a container's args and
// ETCD_* variables the way etcd's main does (etcdmain.configFromCmdLine):
// the server flags of this etcd version (embed.Config.AddFlags) plus
// --initial-cluster-state, variables applied to flags not given on the
// command line, URL flags copied into the config, then embed's Validate.
// An ETCD_* variable that names no flag is an error here (etcd itself only
// warns and ignores it).
func parseEtcdConfig(args []string, env map[string]string) (*embed.Config, error) {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := embed.NewConfig()
	cfg.AddFlags(fs)
	clusterState := etcdflags.NewSelectiveStringValue(embed.ClusterStateFlagNew, embed.ClusterStateFlagExisting)
	fs.Var(clusterState, "initial-cluster-state", "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%q is not a flag", fs.Arg(0))
	}
	for _, name := range keys(env) {
		rest, ok := strings.CutPrefix(name, "ETCD_")
		if !ok {
			continue
		}
		fname := strings.ReplaceAll(strings.ToLower(rest), "_", "-")
		if fs.Lookup(fname) == nil {
			return nil, fmt.Errorf("%s names no etcd %s flag", name, version.Version)
		}
		if etcdflags.IsSet(fs, fname) {
			return nil, fmt.Errorf("%s and --%s both set", name, fname)
		}
		if err := fs.Set(fname, env[name]); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", name, env[name], err)
		}
	}
	cfg.ListenPeerUrls = etcdflags.UniqueURLsFromFlag(fs, "listen-peer-urls")
	cfg.AdvertisePeerUrls = etcdflags.UniqueURLsFromFlag(fs, "initial-advertise-peer-urls")
	cfg.ListenClientUrls = etcdflags.UniqueURLsFromFlag(fs, "listen-client-urls")
	cfg.ListenClientHttpUrls = etcdflags.UniqueURLsFromFlag(fs, "listen-client-http-urls")
	cfg.AdvertiseClientUrls = etcdflags.UniqueURLsFromFlag(fs, "advertise-client-urls")
	cfg.ListenMetricsUrls = etcdflags.UniqueURLsFromFlag(fs, "listen-metrics-urls")
	if etcdflags.IsSet(fs, "listen-client-urls") && !etcdflags.IsSet(fs, "advertise-client-urls") {
		cfg.AdvertiseClientUrls = nil
	}
	cfg.ClusterState = clusterState.String()
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// etcdMembers parses the configuration of every pod of an etcd
// StatefulSet.
func etcdMembers(t *testing.T, b *build, w *workload) ([]*etcdMember, *corev1.Container) {
	t.Helper()
	c := etcdContainer(w)
	if c == nil {
		t.Fatalf("%s: no container named etcd", w)
	}
	var out []*etcdMember
	for _, pod := range w.PodNames() {
		env, _ := envResolver{b: b, w: w, podName: pod}.resolve(c)
		args, _ := expandAll(c.Args, env)
		cfg, err := parseEtcdConfig(args, env)
		if err != nil {
			t.Errorf("%s pod %s: etcd rejects its configuration: %v", w, pod, err)
			continue
		}
		out = append(out, &etcdMember{PodName: pod, Cfg: cfg, Env: env})
	}
	return out, c
}

func etcdContainer(w *workload) *corev1.Container {
	for _, c := range w.Containers() {
		if c.Name == "etcd" {
			return c
		}
	}
	return nil
}

func TestEtcdConfig(t *testing.T) {
	var checked int
	for _, b := range okBuilds(t) {
		ws := byComponent(b, "etcd")
		if len(ws) == 0 {
			continue
		}
		checked++
		t.Run(b.Dir, func(t *testing.T) {
			if len(ws) != 1 {
				t.Fatalf("%d etcd workloads, want 1", len(ws))
			}
			w := ws[0]
			if w.STS == nil {
				t.Fatalf("%s: etcd must be a StatefulSet (stable member names and volumes)", w)
			}
			members, c := etcdMembers(t, b, w)
			if c.Image != etcdImage {
				t.Errorf("%s: image %s, want %s (the etcd version in go.mod)", w, c.Image, etcdImage)
			}
			if w.STS.Spec.PodManagementPolicy != "Parallel" {
				t.Errorf("%s: podManagementPolicy must be Parallel: members are not ready before a quorum forms", w)
			}
			if p := w.Template.Spec.EnableServiceLinks; p == nil || *p {
				t.Errorf("%s: enableServiceLinks must be false, or Service variables named ETCD_* become etcd flags", w)
			}
			checkAntiAffinity(t, w)
			svc := service(b, w.STS.Spec.ServiceName)
			if svc != nil && !svc.Spec.PublishNotReadyAddresses {
				t.Errorf("Service %s: publishNotReadyAddresses must be true, or members cannot find each other before a quorum forms", svc.Name)
			}
			port := func(name string) int32 {
				cp, ok := containerPort(c, intstr.FromString(name))
				if !ok {
					t.Errorf("%s: no container port named %s", w, name)
				}
				return cp.ContainerPort
			}
			clientPort, peerPort, metricsPort := port("client"), port("peer"), port("metrics")
			for _, m := range members {
				checkEtcdMember(t, w, c, m, clientPort, peerPort, metricsPort)
			}
			if len(members) == 0 {
				return
			}
			checkEtcdClients(t, b, w, members[0], clientPort)
		})
	}
	if checked == 0 {
		t.Fatal("no build has an etcd StatefulSet")
	}
}

func checkAntiAffinity(t *testing.T, w *workload) {
	t.Helper()
	aff := w.Template.Spec.Affinity
	if aff != nil && aff.PodAntiAffinity != nil {
		for _, term := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if ok, _ := selects(term.LabelSelector, w.Template.Labels); ok && term.TopologyKey == "kubernetes.io/hostname" {
				return
			}
		}
	}
	t.Errorf("%s: needs required pod anti-affinity on kubernetes.io/hostname against its own pods (one member per node)", w)
}

func checkEtcdMember(t *testing.T, w *workload, c *corev1.Container, m *etcdMember, clientPort, peerPort, metricsPort int32) {
	t.Helper()
	where := fmt.Sprintf("%s pod %s", w, m.PodName)
	cfg := m.Cfg
	if cfg.Name != m.PodName {
		t.Errorf("%s: member name %q, want the pod name", where, cfg.Name)
	}
	urlsmap, _, err := cfg.PeerURLsMapAndToken("etcd")
	if err != nil {
		t.Errorf("%s: initial cluster: %v", where, err)
		return
	}
	if len(urlsmap) != int(w.Replicas) {
		t.Errorf("%s: initial cluster has %d members, the StatefulSet %d replicas", where, len(urlsmap), w.Replicas)
	}
	for i := range w.Replicas {
		name := fmt.Sprintf("%s-%d", w.Name, i)
		us, ok := urlsmap[name]
		if !ok {
			t.Errorf("%s: initial cluster has no member %s", where, name)
			continue
		}
		for _, u := range us {
			if got, ok := memberOrdinal(w, u.Hostname()); !ok || got != int(i) || u.Port() != strconv.Itoa(int(peerPort)) {
				t.Errorf("%s: member %s peer URL %s, want its stable name %s.%s on port %d", where, name, u.String(), name, w.STS.Spec.ServiceName, peerPort)
			}
		}
	}
	own := urlStrings(cfg.AdvertisePeerUrls)
	if !slices.Equal(own, urlStrings(urlsmap[cfg.Name])) {
		t.Errorf("%s: advertises peer URLs %v but the initial cluster lists %v for it", where, own, urlStrings(urlsmap[cfg.Name]))
	}
	tls := !cfg.ClientTLSInfo.Empty()
	scheme := "http"
	if tls {
		scheme = "https"
	}
	for _, set := range []struct {
		name string
		urls []url.URL
		port int32
		tls  bool
	}{
		{"listen client", cfg.ListenClientUrls, clientPort, tls},
		{"advertise client", cfg.AdvertiseClientUrls, clientPort, tls},
		{"listen peer", cfg.ListenPeerUrls, peerPort, false},
		{"listen metrics", cfg.ListenMetricsUrls, metricsPort, false},
	} {
		if len(set.urls) == 0 {
			t.Errorf("%s: no %s URL", where, set.name)
		}
		want := "http"
		if set.tls {
			want = scheme
		}
		for _, u := range set.urls {
			if u.Scheme != want || u.Port() != strconv.Itoa(int(set.port)) {
				t.Errorf("%s: %s URL %s, want scheme %s and port %d", where, set.name, u.String(), want, set.port)
			}
		}
	}
	if !underMount(c, cfg.Dir) {
		t.Errorf("%s: data dir %s is on no volume mount", where, cfg.Dir)
	}
	if tls {
		// Mutual TLS: a client needs a certificate from the CA etcd trusts
		// (etcd demands one as soon as it has a trusted CA file; the
		// setting says so explicitly).
		if !cfg.ClientTLSInfo.ClientCertAuth || cfg.ClientTLSInfo.TrustedCAFile == "" {
			t.Errorf("%s: client TLS without client-cert-auth and a trusted CA; set ETCD_CLIENT_CERT_AUTH=true and ETCD_TRUSTED_CA_FILE (mutual TLS)", where)
		}
		for _, f := range []struct{ setting, file, key string }{
			{"ETCD_CERT_FILE", cfg.ClientTLSInfo.CertFile, "tls.crt"},
			{"ETCD_KEY_FILE", cfg.ClientTLSInfo.KeyFile, "tls.key"},
			{"ETCD_TRUSTED_CA_FILE", cfg.ClientTLSInfo.TrustedCAFile, "ca.crt"},
		} {
			checkTLSFile(t, where, w, c, f.setting, f.file, f.key)
		}
	}
	if !underClaim(w, c, cfg.Dir) {
		t.Errorf("%s: data dir %s is not on a volume claim template (persistent volume)", where, cfg.Dir)
	}
	if cfg.AutoCompactionMode != embed.CompactorModePeriodic {
		t.Errorf("%s: auto-compaction-mode %q, want periodic (retention is sized in time)", where, cfg.AutoCompactionMode)
	}
	if cfg.QuotaBackendBytes <= 0 {
		t.Errorf("%s: set ETCD_QUOTA_BACKEND_BYTES explicitly (sized in deploy/README.md)", where)
	}
}

// checkEtcdClients checks what the kvindex roles dial and write against
// the etcd members: every member, by its stable name, on the client port
// and scheme; transactions within etcd's limits.
func checkEtcdClients(t *testing.T, b *build, w *workload, m *etcdMember, clientPort int32) {
	t.Helper()
	kcs, _ := kvContainers(b)
	scheme := "http"
	var serverSecret string
	if !m.Cfg.ClientTLSInfo.Empty() {
		scheme = "https"
		if sf, err := resolveSecretFile(w, etcdContainer(w), m.Cfg.ClientTLSInfo.KeyFile); err == nil {
			serverSecret = sf.Secret
		}
	}
	var clients int
	for _, k := range kcs {
		if k.Role == "ingester" && k.Cmd != nil {
			// The effective value: the flag as given, or its default.
			if n, err := k.Cmd.Flags().GetInt("max-txn-ops"); err != nil || n < 0 || uint(n) > m.Cfg.MaxTxnOps {
				t.Errorf("%s: --max-txn-ops=%d must be <= etcd's max-txn-ops %d (%v)", k, n, m.Cfg.MaxTxnOps, err)
			}
			// DESIGN: the ingester keeps each transaction under 1.5 MiB,
			// etcd's default request limit.
			if m.Cfg.MaxRequestBytes < 1536*1024 {
				t.Errorf("%s: etcd's max-request-bytes %d is below the 1.5 MiB the ingester's transactions may reach", w, m.Cfg.MaxRequestBytes)
			}
		}
		eps, ok := k.Flags["etcd-endpoints"]
		if !ok {
			continue
		}
		clients++
		seen := map[int]bool{}
		for _, ep := range strings.Split(eps, ",") {
			u, err := url.Parse(ep)
			if err != nil {
				t.Errorf("%s: etcd endpoint %q: %v", k, ep, err)
				continue
			}
			ordinal, ok := memberOrdinal(w, u.Hostname())
			if !ok {
				t.Errorf("%s: etcd endpoint %s is not a member of %s (%s-N.%s, N < %d)", k, ep, w, w.Name, w.STS.Spec.ServiceName, w.Replicas)
				continue
			}
			if u.Scheme != scheme || u.Port() != strconv.Itoa(int(clientPort)) {
				t.Errorf("%s: etcd endpoint %s, want scheme %s and port %d", k, ep, scheme, clientPort)
			}
			seen[ordinal] = true
		}
		if len(seen) != int(w.Replicas) {
			t.Errorf("%s: --etcd-endpoints names %d of the %d etcd members; list them all so the client fails over", k, len(seen), w.Replicas)
		}
		checkClientTLS(t, k, scheme == "https", serverSecret)
	}
	if clients == 0 {
		t.Errorf("etcd runs but no kvindex container dials it")
	}
	// Only etcd holds its server key.
	for _, k := range kcs {
		for _, v := range k.W.Template.Spec.Volumes {
			if serverSecret != "" && v.Secret != nil && v.Secret.SecretName == serverSecret {
				t.Errorf("%s: its pod mounts etcd's server Secret %s; the roles get their own client Secret", k, serverSecret)
			}
		}
	}
}

// etcdTLSFlags maps the kvindex roles' etcd TLS flags (etcdctl's names,
// wiring/cli/common) to the key of the client Secret each reads.
var etcdTLSFlags = map[string]string{
	"etcd-cacert": "ca.crt",
	"etcd-cert":   "tls.crt",
	"etcd-key":    "tls.key",
}

// checkClientTLS checks a role's etcd TLS flags: with TLS on etcd's client
// port, all three set, each a readable file of the key it names in one
// client Secret (not etcd's server Secret); without TLS, none set. The
// process-wide SSL_CERT_FILE is never the way.
func checkClientTLS(t *testing.T, k *kvContainer, tls bool, serverSecret string) {
	t.Helper()
	if f := k.Env["SSL_CERT_FILE"]; f != "" {
		t.Errorf("%s: sets SSL_CERT_FILE=%s, which replaces the system roots of the whole process; use --etcd-cacert", k, f)
	}
	if !tls {
		for _, flag := range keys(etcdTLSFlags) {
			if k.Flags[flag] != "" {
				t.Errorf("%s: sets --%s but etcd serves plain http", k, flag)
			}
		}
		return
	}
	secrets := map[string]bool{}
	for _, flag := range keys(etcdTLSFlags) {
		file := k.Flags[flag]
		if file == "" {
			t.Errorf("%s: etcd requires mutual TLS, so --%s must be set (--etcd-cacert, --etcd-cert and --etcd-key)", k, flag)
			continue
		}
		if sf := checkTLSFile(t, k.String(), k.W, k.C, "--"+flag, file, etcdTLSFlags[flag]); sf != nil {
			secrets[sf.Secret] = true
		}
	}
	if len(secrets) > 1 {
		t.Errorf("%s: the etcd TLS flags read %d Secrets %v; the client certificate, key and CA come from one", k, len(secrets), keys(secrets))
	}
	if secrets[serverSecret] {
		t.Errorf("%s: reads etcd's server Secret %s; the roles use their own client certificate", k, serverSecret)
	}
}

// checkTLSFile checks that a TLS file a setting names is the given key of
// a Secret volume, readable by the container's user. It returns the file,
// or nil after reporting why not.
func checkTLSFile(t *testing.T, where string, w *workload, c *corev1.Container, setting, file, key string) *secretFile {
	t.Helper()
	sf, err := resolveSecretFile(w, c, file)
	if err != nil {
		t.Errorf("%s: %s: %v", where, setting, err)
		return nil
	}
	if sf.Key != key {
		t.Errorf("%s: %s=%s is key %q of Secret %s, want %q", where, setting, file, sf.Key, sf.Secret, key)
	}
	if !readableBy(w, c, sf.Mode) {
		t.Errorf("%s: %s=%s has mode %#o, which the container's non-root user cannot read (set the pod's fsGroup, or widen the mode)", where, setting, file, sf.Mode)
	}
	return sf
}

// memberOrdinal returns N when host is the stable DNS name of member N of
// the etcd StatefulSet w: <sts>-N.<service>, optionally qualified with
// .<namespace>.svc[.cluster.local], N < replicas.
func memberOrdinal(w *workload, host string) (int, bool) {
	member, domain, _ := strings.Cut(host, ".")
	svc := w.STS.Spec.ServiceName
	if domain != svc && domain != svc+"."+w.Namespace+".svc" && domain != svc+"."+w.Namespace+".svc.cluster.local" {
		return 0, false
	}
	rest, ok := strings.CutPrefix(member, w.Name+"-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n >= int(w.Replicas) || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

func urlStrings(us []url.URL) []string {
	var out []string
	for _, u := range us {
		out = append(out, u.String())
	}
	slices.Sort(out)
	return out
}

func underMount(c *corev1.Container, file string) bool {
	for _, m := range c.VolumeMounts {
		if rel, ok := strings.CutPrefix(path.Clean(file), path.Clean(m.MountPath)+"/"); ok && rel != "" {
			return true
		}
	}
	return false
}

func underClaim(w *workload, c *corev1.Container, dir string) bool {
	for _, m := range c.VolumeMounts {
		if _, ok := strings.CutPrefix(path.Clean(dir), path.Clean(m.MountPath)+"/"); !ok {
			continue
		}
		for _, pvc := range w.STS.Spec.VolumeClaimTemplates {
			if pvc.Name == m.Name {
				return true
			}
		}
	}
	return false
}

// TestEtcdConfigRejects proves parseEtcdConfig can fail on the mistakes it
// exists to catch.
func TestEtcdConfigRejects(t *testing.T) {
	good := map[string]string{
		"ETCD_NAME":                        "m-0",
		"ETCD_LISTEN_PEER_URLS":            "http://0.0.0.0:2380",
		"ETCD_LISTEN_CLIENT_URLS":          "http://0.0.0.0:2379",
		"ETCD_ADVERTISE_CLIENT_URLS":       "http://m-0.m.ns.svc:2379",
		"ETCD_INITIAL_ADVERTISE_PEER_URLS": "http://m-0.m.ns.svc:2380",
		"ETCD_INITIAL_CLUSTER":             "m-0=http://m-0.m.ns.svc:2380",
		"ETCD_AUTO_COMPACTION_MODE":        "periodic",
		"ETCD_AUTO_COMPACTION_RETENTION":   "5m",
	}
	if _, err := parseEtcdConfig(nil, good); err != nil {
		t.Fatalf("the valid configuration is rejected: %v", err)
	}
	cases := []struct {
		name string
		set  map[string]string
		args []string
	}{
		{name: "unknown_variable", set: map[string]string{"ETCD_MAX_TXN_OP": "1024"}},
		{name: "not_a_number", set: map[string]string{"ETCD_QUOTA_BACKEND_BYTES": "8Gi"}},
		{name: "bad_cluster_state", set: map[string]string{"ETCD_INITIAL_CLUSTER_STATE": "fresh"}},
		{name: "hostname_in_listen_url", set: map[string]string{"ETCD_LISTEN_CLIENT_URLS": "http://m-0.m:2379"}},
		{name: "unknown_compaction_mode", set: map[string]string{"ETCD_AUTO_COMPACTION_MODE": "hourly"}},
		{name: "flag_and_variable", args: []string{"--name=m-0"}},
		{name: "unknown_flag", args: []string{"--max-txn-op=1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range good {
				env[k] = v
			}
			for k, v := range tc.set {
				env[k] = v
			}
			if _, err := parseEtcdConfig(tc.args, env); err == nil {
				t.Errorf("accepted %v %v", tc.set, tc.args)
			}
		})
	}
}

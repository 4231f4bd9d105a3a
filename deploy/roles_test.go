package deploy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/indexd"
	"github.com/kvindex/kvindex/ingester"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/logging"
	"github.com/kvindex/kvindex/wiring/cli"
)

// requiredFlags are the flags each role must be given in a cluster: the
// defaults are loopback addresses or the local single-node setup. Which
// flags a cluster must set is a deploy decision; whether a flag exists and
// takes the value given is the command tree's (parseRoleArgs).
var requiredFlags = map[string][]string{
	"ingester": {"brokers", "topic", "group", "etcd-endpoints", "metrics-listen", "max-txn-ops"},
	"indexd":   {"etcd-endpoints", "listen", "metrics-listen"},
	"bridge":   {"zmq", "replay", "brokers", "topic", "pod", "model", "metrics-listen"},
}

// bindBridgeFlags are what a bind-mode bridge (--zmq-bind, one for a
// fleet, examples/llm-d) must be given instead of the sidecar's.
var bindBridgeFlags = []string{"zmq-bind", "replay-pattern", "brokers", "topic", "metrics-listen"}

// bindMode reports a bridge container in the bind mode.
func (k *kvContainer) bindMode() bool {
	return k.Role == "bridge" && (k.Flags["zmq-bind"] != "" || k.Flags["listen"] != "")
}

// required are the flags k's role must be given.
func (k *kvContainer) required() []string {
	if k.bindMode() {
		return bindBridgeFlags
	}
	return requiredFlags[k.Role]
}

// kvContainer is a kvindex container with its args resolved for one pod.
type kvContainer struct {
	W *workload
	C *corev1.Container
	// Role is the name of the subcommand the args run ("" when they name
	// none).
	Role string
	// Flags are the flags the args set, name to value as written (after
	// $(VAR) expansion).
	Flags map[string]string
	// Cmd is the subcommand with the args parsed into its flag set, for
	// effective values (defaults included); nil when parsing failed.
	Cmd *cobra.Command
	Env map[string]string
}

func (k *kvContainer) String() string {
	return fmt.Sprintf("%s container %s (%s)", k.W, k.C.Name, k.Role)
}

// kvContainers returns the build's kvindex containers (the kvindex image),
// args expanded, and the problems found parsing them.
func kvContainers(b *build) ([]*kvContainer, []string) {
	var out []*kvContainer
	var problems []string
	for _, w := range workloads(b) {
		for _, c := range w.Containers() {
			if imageRepo(c.Image) != kvindexImage {
				continue
			}
			where := fmt.Sprintf("%s container %s", w, c.Name)
			env, _ := envResolver{b: b, w: w, podName: w.PodNames()[0]}.resolve(c)
			args, _ := expandAll(c.Args, env)
			cmd, flags, bad := parseRoleArgs(args)
			for _, p := range bad {
				problems = append(problems, fmt.Sprintf("%s: %s", where, p))
			}
			if len(c.Command) > 0 {
				problems = append(problems, fmt.Sprintf("%s: sets command %v; the image's entrypoint is the kvindex binary, give the role as the first arg", where, c.Command))
			}
			k := &kvContainer{W: w, C: c, Flags: flags, Env: env}
			if cmd != nil {
				k.Role = cmd.Name()
				if len(bad) == 0 {
					k.Cmd = cmd
				}
			} else if len(args) > 0 {
				k.Role = args[0]
			}
			out = append(out, k)
		}
	}
	return out, problems
}

// parseRoleArgs parses a kvindex container's args (after $(VAR) expansion)
// the way the binary would: a fresh command tree from cli.NewRoot (parsing
// sets flag values, so a tree serves one parse), the subcommand the first
// arg names, and the rest parsed by that subcommand's flag set, so an
// unknown flag, a value of the wrong type (duration, int, bool) or a
// missing or unknown subcommand is a problem. Beyond parsing it checks
// what each role would reject before doing any I/O: the log level and
// format, the key prefix, the etcd TLS flags, and the role's Config as its
// Validate sees it (roleConfigErrors). It also reports args not written as
// --name=value, the manifests' form, so a value is never taken for a flag.
//
// flags holds the flags set, name to value as written. cmd is nil when the
// args name no subcommand.
func parseRoleArgs(args []string) (cmd *cobra.Command, flags map[string]string, problems []string) {
	sub, flags, bad := flagValues(args)
	for _, a := range bad {
		problems = append(problems, fmt.Sprintf("arg %q is not --name=value", a))
	}
	root := cli.NewRoot()
	cmd, rest, err := root.Find(args)
	switch {
	case err != nil:
		return nil, flags, append(problems, fmt.Sprintf("the args name no kvindex subcommand: %v", err))
	case cmd == root && sub != "":
		// The root takes any word, to refuse it as a usage error itself.
		return nil, flags, append(problems, fmt.Sprintf("the args name no kvindex subcommand: unknown command %q", sub))
	case cmd == root || sub == "":
		return nil, flags, append(problems, fmt.Sprintf("the first arg must be a kvindex subcommand (the image's entrypoint is the binary), got %q", args))
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return cmd, flags, append(problems, fmt.Sprintf("kvindex %s rejects the args: %v", cmd.Name(), err))
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return cmd, flags, append(problems, fmt.Sprintf("kvindex %s rejects the args: %v", cmd.Name(), err))
	}
	fs := cmd.Flags()
	if help, _ := fs.GetBool("help"); help {
		problems = append(problems, "--help prints usage and exits")
	}
	if fs.Lookup("log-level") != nil {
		lvl, _ := fs.GetString("log-level")
		format, _ := fs.GetString("log-format")
		if _, err := logging.New(io.Discard, lvl, logging.Format(format)); err != nil {
			problems = append(problems, fmt.Sprintf("--log-level=%s --log-format=%s: %v", lvl, format, err))
		}
	}
	if fs.Lookup("etcd-prefix") != nil {
		prefix, _ := fs.GetString("etcd-prefix")
		if _, err := keyspace.New(prefix); err != nil {
			problems = append(problems, fmt.Sprintf("--etcd-prefix=%s: %v", prefix, err))
		}
		cert, _ := fs.GetString("etcd-cert")
		key, _ := fs.GetString("etcd-key")
		if (cert == "") != (key == "") {
			problems = append(problems, "--etcd-cert and --etcd-key go together (wiring/cli/common)")
		}
	}
	problems = append(problems, roleConfigErrors(cmd.Name(), fs)...)
	return cmd, flags, problems
}

// roleConfigErrors builds the Config a role's command builds from its
// flags (wiring/cli/<role>cmd) and returns what the role package's
// Validate says about it: the cross-field rules the flag parser cannot
// know (the ingester's lease TTL against its group timeouts, the bridge's
// buffer sizes against its record limit, ...). A flag the mapping reads
// and the command no longer has is a problem too: the mapping is stale.
func roleConfigErrors(role string, fs *pflag.FlagSet) []string {
	var errs []error
	str := func(name string) string { v, err := fs.GetString(name); errs = append(errs, err); return v }
	strs := func(name string) []string { v, err := fs.GetStringSlice(name); errs = append(errs, err); return v }
	num := func(name string) int { v, err := fs.GetInt(name); errs = append(errs, err); return v }
	dur := func(name string) time.Duration { v, err := fs.GetDuration(name); errs = append(errs, err); return v }
	ks := func() keyspace.Keyspace { k, _ := keyspace.New(str("etcd-prefix")); return k }
	// Validate only asks that an etcd client is set; the test dials nothing.
	placeholder := &clientv3.Client{}
	var err error
	switch role {
	case "ingester":
		cfg := ingester.DefaultConfig()
		cfg.Etcd, cfg.Keyspace = placeholder, ks()
		cfg.Brokers, cfg.Topic, cfg.Group, cfg.ID = strs("brokers"), str("topic"), str("group"), str("id")
		cfg.LeaseTTL, cfg.LivenessWindow, cfg.MaxTxnOps = dur("lease-ttl"), dur("liveness-window"), num("max-txn-ops")
		err = cfg.Validate()
	case "indexd":
		cfg := indexd.DefaultConfig()
		cfg.Etcd, cfg.Keyspace, cfg.ListenAddr = placeholder, ks(), str("listen")
		cfg.MaxHashes, cfg.MaxCandidates, cfg.MaxRequestBytes = num("max-hashes"), num("max-candidates"), num("max-request-bytes")
		cfg.BarrierTimeout, cfg.MaxBarrierTimeout = dur("barrier-timeout"), dur("max-barrier-timeout")
		cfg.ListConcurrency, cfg.ShutdownGrace = num("list-concurrency"), dur("shutdown-grace")
		err = cfg.Validate()
	case "bridge":
		cfg := bridge.DefaultConfig()
		cfg.Pod, cfg.Model, cfg.ZMQTopic = str("pod"), str("model"), str("zmq-topic")
		cfg.Brokers, cfg.Topic = strs("brokers"), str("topic")
		rank, rerr := fs.GetUint32("dp-rank")
		offset, oerr := fs.GetBool("offset-by-rank")
		errs = append(errs, rerr, oerr)
		cfg.DPRank, cfg.Endpoint, cfg.ReplayEndpoint = rank, str("zmq"), str("replay")
		cfg.TopicPattern, cfg.ReplayPattern = str("topic-pattern"), str("replay-pattern")
		cfg.MaxPods, cfg.MaxConnections, cfg.PodQueueSize = num("max-pods"), num("max-connections"), num("pod-queue-size")
		cfg.PodIdleTimeout = dur("pod-idle-timeout")
		if cfg.Listen = str("zmq-bind"); cfg.Listen == "" {
			cfg.Listen = str("listen")
		}
		if cfg.Listen != "" {
			// The command ignores --zmq's default in the bind mode.
			cfg.Endpoint = ""
		} else if offset {
			if cfg.Endpoint, err = bridge.OffsetEndpointPort(cfg.Endpoint, rank); err != nil {
				break
			}
			if cfg.ReplayEndpoint, err = bridge.OffsetEndpointPort(cfg.ReplayEndpoint, rank); err != nil {
				break
			}
		}
		cfg.HeartbeatInterval, cfg.GracePeriod, cfg.FlushTimeout = dur("heartbeat-interval"), dur("grace-period"), dur("flush-timeout")
		cfg.MaxBufferedRecords, cfg.MaxBufferedBytes = num("max-buffered-records"), num("max-buffered-bytes")
		cfg.MaxRecordBytes, cfg.MaxMessageBytes = num("max-record-bytes"), num("max-message-bytes")
		err = cfg.Validate()
	default:
		return nil
	}
	var out []string
	if e := errors.Join(errs...); e != nil {
		out = append(out, fmt.Sprintf("the test's flag-to-Config mapping for %s is stale (see wiring/cli/%scmd): %v", role, role, e))
	}
	if err != nil {
		out = append(out, fmt.Sprintf("kvindex %s would reject its configuration: %v", role, err))
	}
	return out
}

func imageRepo(ref string) string {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	slash := strings.LastIndexByte(ref, '/')
	if colon := strings.LastIndexByte(ref, ':'); colon > slash {
		ref = ref[:colon]
	}
	return ref
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func TestKvindexRoles(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			kcs, problems := kvContainers(b)
			for _, p := range problems {
				t.Error(p)
			}
			images := map[string]bool{}
			for _, k := range kcs {
				images[k.C.Image] = true
				if k.Cmd == nil {
					continue // kvContainers reported why
				}
				if _, ok := requiredFlags[k.Role]; !ok {
					t.Errorf("%s: kvindex %s is not a role a cluster runs (%v)", k, k.Role, keys(requiredFlags))
					continue
				}
				if k.W.Labels[labelName] == "kvindex" && k.W.Component() != k.Role {
					t.Errorf("%s: runs role %q in pods labelled %s=%s", k, k.Role, labelComponent, k.W.Component())
				}
				for _, name := range k.required() {
					if k.Flags[name] == "" {
						t.Errorf("%s: --%s must be set (its default suits a single local process, not a cluster)", k, name)
					}
				}
				checkListen(t, k, "metrics-listen", "metrics")
				checkScrape(t, k, podmates(kcs, k))
				switch k.Role {
				case "indexd":
					port, probeFlag := checkListen(t, k, "listen", "grpc"), "listen"
					// With a health port, the probes use it: it stays
					// plaintext when the API port requires TLS, which
					// kubelet's gRPC probe does not speak.
					if _, ok := k.Flags["health-listen"]; ok {
						port, probeFlag = checkListen(t, k, "health-listen", "health"), "health-listen"
					}
					for kind, pr := range map[string]*corev1.Probe{"startup": k.C.StartupProbe, "readiness": k.C.ReadinessProbe, "liveness": k.C.LivenessProbe} {
						if pr == nil || pr.GRPC == nil || pr.GRPC.Port != port {
							t.Errorf("%s: %s probe must be a gRPC probe on the --%s port %d (the gRPC health service)", k, kind, probeFlag, port)
						}
					}
				case "ingester":
					checkHTTPProbe(t, k, "liveness", k.C.LivenessProbe, "/healthz")
					checkHTTPProbe(t, k, "readiness", k.C.ReadinessProbe, "/readyz")
				case "bridge":
					checkHTTPProbe(t, k, "liveness", k.C.LivenessProbe, "/healthz")
					if k.bindMode() {
						// A central bridge is its own Service's endpoint:
						// ready while it listens.
						checkHTTPProbe(t, k, "readiness", k.C.ReadinessProbe, "/readyz")
						break
					}
					// A sidecar's readiness is the pod's: the model server
					// must not leave its Service because Kafka is away.
					if k.C.ReadinessProbe != nil {
						t.Errorf("%s: the bridge has a readiness probe; it would take the model server out of service when Kafka or the bridge is down", k)
					}
				}
			}
			if len(images) > 1 {
				t.Errorf("kvindex containers use %d different images %v; one image serves every role", len(images), keys(images))
			}
		})
	}
}

// checkListen checks a --flag=host:port listen address: set, not loopback
// (probes and other pods could not reach it), and declared as the named
// container port (or portName-N, for the second and later containers of
// a role in one pod: port names are unique per pod). It returns the port.
func checkListen(t *testing.T, k *kvContainer, flag, portName string) int32 {
	t.Helper()
	addr, ok := k.Flags[flag]
	if !ok {
		return 0
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: --%s=%s: %v", k, flag, addr, err)
		return 0
	}
	if isLoopback(host) {
		t.Errorf("%s: --%s=%s listens on loopback only; probes and clients come from outside the pod", k, flag, addr)
	}
	port, err := portOf(addr)
	if err != nil {
		t.Errorf("%s: --%s: %v", k, flag, err)
		return 0
	}
	cp, ok := containerPort(k.C, intstr.FromInt32(port))
	if !ok {
		t.Errorf("%s: --%s port %d is not a declared container port", k, flag, port)
	} else if suffix, ok := strings.CutPrefix(cp.Name, portName+"-"); cp.Name != portName && (!ok || suffix == "") {
		t.Errorf("%s: --%s port %d is named %q, want %q (or %s-N)", k, flag, port, cp.Name, portName, portName)
	}
	return port
}

// checkScrape checks the pod's Prometheus annotations point at the
// --metrics-listen port of a kvindex container of the pod (they name one
// port per pod: with several, k's own or that of another kvindex
// container; deploy/README.md says to scrape the rest with a PodMonitor).
func checkScrape(t *testing.T, k *kvContainer, pod []*kvContainer) {
	t.Helper()
	var ports []string
	for _, other := range pod {
		if port, err := portOf(other.Flags["metrics-listen"]); err == nil {
			ports = append(ports, strconv.Itoa(int(port)))
		}
	}
	a := k.W.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || !slices.Contains(ports, a["prometheus.io/port"]) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: pod annotations prometheus.io/{scrape,port,path} = %q, %q, %q; want \"true\", one of %q, \"/metrics\"",
			k, a["prometheus.io/scrape"], a["prometheus.io/port"], a["prometheus.io/path"], ports)
	}
}

// podmates returns the kvindex containers of kcs in k's pod.
func podmates(kcs []*kvContainer, k *kvContainer) []*kvContainer {
	var out []*kvContainer
	for _, other := range kcs {
		if other.W == k.W {
			out = append(out, other)
		}
	}
	return out
}

func checkHTTPProbe(t *testing.T, k *kvContainer, kind string, pr *corev1.Probe, path string) {
	t.Helper()
	metrics, err := portOf(k.Flags["metrics-listen"])
	if err != nil {
		return
	}
	if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != path {
		t.Errorf("%s: %s probe must be httpGet %s on the ops port", k, kind, path)
		return
	}
	cp, ok := containerPort(k.C, pr.HTTPGet.Port)
	if !ok || cp.ContainerPort != metrics {
		t.Errorf("%s: %s probe port %s is not the --metrics-listen port %d", k, kind, pr.HTTPGet.Port.String(), metrics)
	}
}

// TestParseRoleArgs proves the cross-check against the command tree can
// fail: each case is a valid role's args with one mistake, and each must
// be reported. The valid args themselves must pass, or the rejections
// would prove nothing.
func TestParseRoleArgs(t *testing.T) {
	valid := map[string][]string{
		"ingester": {"ingester", "--brokers=kafka:9092", "--topic=kvindex-events", "--group=kvindex-ingester",
			"--etcd-endpoints=http://etcd-0.etcd:2379", "--etcd-prefix=/kvindex/v2/", "--max-txn-ops=1024",
			"--lease-ttl=120s", "--liveness-window=30s", "--metrics-listen=:9090", "--log-format=json"},
		"indexd": {"indexd", "--etcd-endpoints=https://etcd-0.etcd:2379", "--etcd-cacert=/tls/ca.crt",
			"--etcd-cert=/tls/tls.crt", "--etcd-key=/tls/tls.key", "--listen=:50051", "--metrics-listen=:9090",
			"--max-hashes=8192", "--pprof=false"},
		"bridge": {"bridge", "--zmq=tcp://127.0.0.1:5557", "--replay=tcp://127.0.0.1:5558", "--brokers=kafka:9092",
			"--topic=kvindex-events", "--pod=192.0.2.10:8000", "--model=qwen3-8b", "--dp-rank=1",
			"--heartbeat-interval=5s", "--metrics-listen=:9091"},
	}
	for _, role := range keys(valid) {
		t.Run("valid_"+role, func(t *testing.T) {
			cmd, flags, problems := parseRoleArgs(valid[role])
			if len(problems) > 0 {
				t.Fatalf("valid args rejected: %v", problems)
			}
			if cmd == nil || cmd.Name() != role || len(flags) != len(valid[role])-1 {
				t.Fatalf("parsed as %v with flags %v", cmd, flags)
			}
		})
	}
	cases := []struct {
		name string
		role string
		// edit changes the valid args of role.
		edit func([]string) []string
		// want is a fragment of the problem reported.
		want string
	}{
		{name: "unknown_flag", role: "indexd", edit: add("--max-hash=10"), want: "unknown flag: --max-hash"},
		{name: "another_roles_flag", role: "ingester", edit: add("--listen=:50051"), want: "unknown flag: --listen"},
		{name: "bad_duration", role: "ingester", edit: add("--liveness-window=30"), want: "missing unit"},
		{name: "bad_int", role: "ingester", edit: add("--max-txn-ops=1k"), want: "--max-txn-ops"},
		{name: "bad_bool", role: "indexd", edit: add("--pprof=yes"), want: "--pprof"},
		{name: "bad_uint", role: "bridge", edit: add("--dp-rank=-1"), want: "--dp-rank"},
		{name: "missing_subcommand", role: "indexd", edit: func(a []string) []string { return a[1:] }, want: "subcommand"},
		{name: "unknown_subcommand", role: "indexd", edit: func(a []string) []string { return append([]string{"indexer"}, a[1:]...) }, want: "unknown command"},
		{name: "subcommand_not_first", role: "indexd", edit: func(a []string) []string { return append(a[1:], "indexd") }, want: "first arg"},
		{name: "positional_arg", role: "indexd", edit: func(a []string) []string { return append(a[:1:1], append([]string{"extra"}, a[1:]...)...) }, want: "extra"},
		{name: "separate_value", role: "indexd", edit: func(a []string) []string { return append(a, "--max-hashes", "64") }, want: "not --name=value"},
		{name: "repeated_flag", role: "indexd", edit: add("--listen=:50052"), want: "repeated"},
		{name: "bad_log_level", role: "bridge", edit: add("--log-level=verbose"), want: "--log-level"},
		{name: "bad_log_format", role: "ingester", edit: replace("--log-format=json", "--log-format=logfmt"), want: "--log-format"},
		{name: "prefix_without_slash", role: "ingester", edit: replace("--etcd-prefix=/kvindex/v2/", "--etcd-prefix=/kvindex/v2"), want: "--etcd-prefix"},
		{name: "cert_without_key", role: "indexd", edit: replace("--etcd-key=/tls/tls.key", "--etcd-key="), want: "go together"},
		{name: "lease_ttl_fraction", role: "ingester", edit: replace("--lease-ttl=120s", "--lease-ttl=90500ms"), want: "LeaseTTL"},
		{name: "lease_ttl_under_timeouts", role: "ingester", edit: replace("--lease-ttl=120s", "--lease-ttl=10s"), want: "LeaseTTL"},
		{name: "max_txn_ops_too_small", role: "ingester", edit: replace("--max-txn-ops=1024", "--max-txn-ops=4"), want: "MaxTxnOps"},
		{name: "negative_limit", role: "indexd", edit: replace("--max-hashes=8192", "--max-hashes=-1"), want: "MaxHashes"},
		{name: "bridge_without_model", role: "bridge", edit: replace("--model=qwen3-8b", "--model="), want: "Model"},
		{name: "bridge_zmq_not_tcp", role: "bridge", edit: replace("--zmq=tcp://127.0.0.1:5557", "--zmq=127.0.0.1:5557"), want: "tcp://HOST:PORT"},
		{name: "bridge_buffer_under_record", role: "bridge", edit: add("--max-buffered-bytes=1024"), want: "MaxBufferedBytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.edit(slices.Clone(valid[tc.role]))
			_, _, problems := parseRoleArgs(args)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("args %q: problems %q, want one mentioning %q", args, problems, tc.want)
			}
		})
	}
}

// add returns an edit that appends args.
func add(args ...string) func([]string) []string {
	return func(a []string) []string { return append(a, args...) }
}

// replace returns an edit that replaces the arg old with new; it panics
// when old is missing, so a case cannot silently test the valid args.
func replace(old, new string) func([]string) []string {
	return func(a []string) []string {
		i := slices.Index(a, old)
		if i < 0 {
			panic(fmt.Sprintf("no arg %q in %q", old, a))
		}
		a[i] = new
		return a
	}
}

package deploy

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The CLI flag contract the manifests are written against (the team notes,
// "CLI flag contract"). The lead's test checks the args against the real
// cobra command tree; this one keeps the manifests inside the contract
// until then, and checks the values that must agree with the rest of the
// manifests.
var (
	sharedFlags = []string{"log-level", "log-format", "etcd-endpoints", "etcd-prefix", "brokers", "topic", "metrics-listen", "pprof"}
	roleFlags   = map[string][]string{
		"ingester": {"group", "lease-ttl", "liveness-window", "max-txn-ops"},
		"indexd":   {"listen", "max-hashes"},
		"bridge":   {"zmq", "replay", "pod", "model", "dp-rank", "heartbeat-interval", "grace-period"},
	}
	// requiredFlags are the flags each role must be given in a cluster:
	// the defaults are loopback addresses or the local single-node setup.
	requiredFlags = map[string][]string{
		"ingester": {"brokers", "topic", "group", "etcd-endpoints", "metrics-listen", "max-txn-ops"},
		"indexd":   {"etcd-endpoints", "listen", "metrics-listen"},
		"bridge":   {"zmq", "replay", "brokers", "topic", "pod", "model", "metrics-listen"},
	}
)

// kvContainer is a kvindex container with its args resolved for one pod.
type kvContainer struct {
	W     *workload
	C     *corev1.Container
	Role  string
	Flags map[string]string
	Env   map[string]string
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
			role, flags, bad := flagValues(args)
			for _, a := range bad {
				problems = append(problems, fmt.Sprintf("%s: arg %q is not --name=value", where, a))
			}
			if len(c.Command) > 0 {
				problems = append(problems, fmt.Sprintf("%s: sets command %v; the image's entrypoint is the kvindex binary, give the role as the first arg", where, c.Command))
			}
			out = append(out, &kvContainer{W: w, C: c, Role: role, Flags: flags, Env: env})
		}
	}
	return out, problems
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
				allowed := slices.Concat(sharedFlags, roleFlags[k.Role])
				if _, ok := roleFlags[k.Role]; !ok {
					t.Errorf("%s: first arg %q is not a role (%v)", k, k.Role, keys(roleFlags))
					continue
				}
				if k.W.Labels[labelName] == "kvindex" && k.W.Component() != k.Role {
					t.Errorf("%s: runs role %q in pods labelled %s=%s", k, k.Role, labelComponent, k.W.Component())
				}
				for name := range k.Flags {
					if !slices.Contains(allowed, name) {
						t.Errorf("%s: --%s is not in the CLI contract of %s", k, name, k.Role)
					}
				}
				for _, name := range requiredFlags[k.Role] {
					if k.Flags[name] == "" {
						t.Errorf("%s: --%s must be set (its default suits a single local process, not a cluster)", k, name)
					}
				}
				checkListen(t, k, "metrics-listen", "metrics")
				checkScrape(t, k)
				switch k.Role {
				case "indexd":
					port := checkListen(t, k, "listen", "grpc")
					for kind, pr := range map[string]*corev1.Probe{"startup": k.C.StartupProbe, "readiness": k.C.ReadinessProbe, "liveness": k.C.LivenessProbe} {
						if pr == nil || pr.GRPC == nil || pr.GRPC.Port != port {
							t.Errorf("%s: %s probe must be a gRPC probe on the --listen port %d (the gRPC health service)", k, kind, port)
						}
					}
				case "ingester":
					checkHTTPProbe(t, k, "liveness", k.C.LivenessProbe, "/healthz")
					checkHTTPProbe(t, k, "readiness", k.C.ReadinessProbe, "/readyz")
				case "bridge":
					checkHTTPProbe(t, k, "liveness", k.C.LivenessProbe, "/healthz")
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
// container port. It returns the port.
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
	} else if cp.Name != portName {
		t.Errorf("%s: --%s port %d is named %q, want %q", k, flag, port, cp.Name, portName)
	}
	return port
}

// checkScrape checks the pod's Prometheus annotations point at the
// container's --metrics-listen port.
func checkScrape(t *testing.T, k *kvContainer) {
	t.Helper()
	port, err := portOf(k.Flags["metrics-listen"])
	if err != nil {
		return
	}
	a := k.W.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(port)) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("%s: pod annotations prometheus.io/{scrape,port,path} = %q, %q, %q; want \"true\", %q, \"/metrics\"",
			k, a["prometheus.io/scrape"], a["prometheus.io/port"], a["prometheus.io/path"], strconv.Itoa(int(port)))
	}
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

package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// vllmKVEventsConfig is the JSON of vLLM's --kv-events-config
// (vllm.config.kv_events.KVEventsConfig).
type vllmKVEventsConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           string  `json:"publisher"`
	Endpoint            string  `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	Topic               string  `json:"topic"`
	BufferSteps         *int    `json:"buffer_steps,omitempty"`
	HWM                 *int    `json:"hwm,omitempty"`
	MaxQueueSize        *int    `json:"max_queue_size,omitempty"`
}

// engineArgs parses a model server's args: "--name=value", "--flag" and
// positionals (vLLM's argparse accepts all three).
func engineArgs(args []string) (map[string]string, []string) {
	flags := map[string]string{}
	var positional []string
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			positional = append(positional, a)
			continue
		}
		n, v, _ := strings.Cut(name, "=")
		flags[n] = v
	}
	return flags, positional
}

// zmqPort returns the port of a ZMQ tcp:// endpoint.
func zmqPort(ep string) (host string, port int32, err error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q is not a tcp:// endpoint", ep)
	}
	host, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseInt(p, 10, 32)
	return host, int32(n), err
}

// TestModelServerSidecar checks every pod that runs kvindex bridges: the
// engine beside them publishes KV events where each bridge subscribes,
// with the hashing routers can reproduce; there is one bridge per engine
// data-parallel rank; and the bridges name the endpoint and model the way
// the router does.
func TestModelServerSidecar(t *testing.T) {
	var checked int
	for _, b := range okBuilds(t) {
		kcs, _ := kvContainers(b)
		pods := map[*workload][]*kvContainer{}
		var order []*workload
		for _, k := range kcs {
			if k.Role != "bridge" || k.Cmd == nil || k.Flags["zmq-bind"] != "" || k.Flags["listen"] != "" {
				continue // bind-mode bridges run alone (TestLLMDExample)
			}
			if _, ok := pods[k.W]; !ok {
				order = append(order, k.W)
			}
			pods[k.W] = append(pods[k.W], k)
		}
		for _, w := range order {
			checked++
			t.Run(b.Dir+"/"+w.Name, func(t *testing.T) {
				checkModelServerPod(t, b, w, pods[w])
			})
		}
	}
	if checked == 0 {
		t.Fatal("no build runs a kvindex bridge (examples/vllm-sidecar should)")
	}
}

// bridgeRank is a bridge's effective rank and port offset.
func bridgeRank(t *testing.T, k *kvContainer) (rank uint32, offset bool) {
	t.Helper()
	rank, err := k.Cmd.Flags().GetUint32("dp-rank")
	if err != nil {
		t.Fatalf("%s: --dp-rank: %v", k, err)
	}
	offset, err = k.Cmd.Flags().GetBool("offset-by-rank")
	if err != nil {
		t.Fatalf("%s: --offset-by-rank: %v", k, err)
	}
	return rank, offset
}

// rankPortName is the name a port of rank r is declared under: base for
// rank 0, base-r after (port names are unique in a pod).
func rankPortName(base string, r uint32) string {
	if r == 0 {
		return base
	}
	return fmt.Sprintf("%s-%d", base, r)
}

func checkModelServerPod(t *testing.T, b *build, w *workload, bridges []*kvContainer) {
	t.Helper()
	for _, k := range bridges {
		isSidecar := slices.ContainsFunc(w.Template.Spec.InitContainers, func(c corev1.Container) bool {
			return c.Name == k.C.Name && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		})
		if !isSidecar {
			t.Errorf("%s: run the bridge as a native sidecar (init container, restartPolicy: Always) so it outlives the engine at shutdown", k)
		}
		// docs/bridge.md: the pod's grace must cover two flushes and the
		// grace period, plus the engine's own shutdown.
		flush, err1 := k.Cmd.Flags().GetDuration("flush-timeout")
		grace, err2 := k.Cmd.Flags().GetDuration("grace-period")
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if tgps := w.Template.Spec.TerminationGracePeriodSeconds; tgps == nil || time.Duration(*tgps)*time.Second <= 2*flush+grace {
			t.Errorf("%s: terminationGracePeriodSeconds must exceed 2 x --flush-timeout + --grace-period (%v) plus the engine's shutdown (docs/bridge.md)", k, 2*flush+grace)
		}
	}
	var engine *corev1.Container
	var cfgJSON string
	var engineFlags map[string]string
	var engineEnv map[string]string
	for _, c := range w.Containers() {
		env, _ := envResolver{b: b, w: w, podName: w.PodNames()[0]}.resolve(c)
		args, _ := expandAll(c.Args, env)
		flags, _ := engineArgs(args)
		if v, ok := flags["kv-events-config"]; ok {
			engine, cfgJSON, engineFlags, engineEnv = c, v, flags, env
		}
	}
	if engine == nil {
		t.Fatalf("%s: no container in the pod passes --kv-events-config", w)
	}
	where := fmt.Sprintf("%s container %s", w, engine.Name)
	var cfg vllmKVEventsConfig
	dec := json.NewDecoder(strings.NewReader(cfgJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: --kv-events-config: %v", where, err)
	}
	if !cfg.EnableKVCacheEvents || cfg.Publisher != "zmq" {
		t.Errorf("%s: --kv-events-config must enable events with the zmq publisher", where)
	}
	if cfg.Topic != "" {
		t.Errorf("%s: ZMQ topic %q; the bridge subscribes to every topic, keep it empty", where, cfg.Topic)
	}

	// Data parallelism: the engine of rank r binds each configured port + r
	// (vLLM's ZmqEventPublisher.offset_endpoint_port); an endpoint is (pod,
	// rank), so one bridge per rank.
	for _, f := range []string{"data-parallel-size-local", "data-parallel-start-rank", "data-parallel-address"} {
		if _, ok := engineFlags[f]; ok {
			t.Errorf("%s: --%s (data parallelism across pods) is not covered by this check; extend it first", where, f)
		}
	}
	ranks := uint32(1)
	if v, ok := engineFlags["data-parallel-size"]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			t.Fatalf("%s: --data-parallel-size=%q", where, v)
		}
		ranks = uint32(n)
	}
	if len(bridges) != int(ranks) {
		t.Errorf("%s: the engine runs %d data-parallel ranks but the pod has %d bridges; run one per rank (--dp-rank)", w, ranks, len(bridges))
	}
	seen := map[uint32]*kvContainer{}
	for _, k := range bridges {
		r, _ := bridgeRank(t, k)
		if r >= ranks {
			t.Errorf("%s: --dp-rank=%d, but the engine's ranks are 0-%d", k, r, ranks-1)
		}
		if prev, dup := seen[r]; dup {
			t.Errorf("%s: --dp-rank=%d is also %s's", k, r, prev.C.Name)
		}
		seen[r] = k
	}

	servePort := engineFlags["port"]
	enginePorts := map[int32]string{}
	claim := func(port int32, what string) {
		if prev, ok := enginePorts[port]; ok {
			t.Errorf("%s: port %d is both %s and %s", where, port, prev, what)
		}
		enginePorts[port] = what
	}
	if n, err := strconv.ParseInt(servePort, 10, 32); err == nil {
		claim(int32(n), "the serving port")
	}
	for _, pair := range []struct{ engineEP, bridgeFlag, portName string }{
		{cfg.Endpoint, "zmq", "kv-events"},
		{deref(cfg.ReplayEndpoint), "replay", "kv-replay"},
	} {
		if pair.engineEP == "" {
			t.Errorf("%s: set %s's endpoint in --kv-events-config (the bridge heals gaps from it)", where, pair.bridgeFlag)
			continue
		}
		_, base, err := zmqPort(pair.engineEP)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for r := range ranks {
			port := base + int32(r)
			claim(port, fmt.Sprintf("rank %d's %s socket", r, pair.portName))
			if cp, ok := containerPort(engine, intstr.FromInt32(port)); !ok || cp.Name != rankPortName(pair.portName, r) {
				t.Errorf("%s: declare rank %d's port %d as %q", where, r, port, rankPortName(pair.portName, r))
			}
		}
		for _, k := range bridges {
			r, offset := bridgeRank(t, k)
			host, port, err := zmqPort(k.Flags[pair.bridgeFlag])
			if err != nil {
				t.Errorf("%s: --%s: %v", k, pair.bridgeFlag, err)
				continue
			}
			if offset {
				port += int32(r)
			}
			if want := base + int32(r); !isLoopback(host) || port != want {
				t.Errorf("%s: --%s=%s with --dp-rank=%d (offset-by-rank %v) dials port %d, want rank %d's port %d on the pod's loopback",
					k, pair.bridgeFlag, k.Flags[pair.bridgeFlag], r, offset, port, r, want)
			}
		}
	}

	// Token mode (the ingesters' default): the fleet keeps vLLM's own
	// hashing; nothing about it must change (DESIGN, "Hashing").
	if _, ok := engineFlags["enable-prefix-caching"]; !ok {
		t.Errorf("%s: --enable-prefix-caching must be on", where)
	}
	if algo, ok := engineFlags["prefix-caching-hash-algo"]; ok {
		t.Errorf("%s: --prefix-caching-hash-algo=%q; token mode needs no particular algorithm, so the example sets none", where, algo)
	}
	if seed, ok := engineEnv["PYTHONHASHSEED"]; ok {
		t.Errorf("%s: PYTHONHASHSEED=%q; token mode needs no fixed seed, so the example sets none", where, seed)
	}
	if engineFlags["block-size"] == "" {
		t.Errorf("%s: set --block-size; Lookup reports it with every match", where)
	}

	// Identity: the model routers route by, and the endpoint they see; the
	// same pod for every rank.
	if servePort == "" {
		t.Errorf("%s: set --port explicitly; the bridge's --pod names it", where)
	} else if n, err := strconv.Atoi(servePort); err != nil {
		t.Errorf("%s: --port=%q", where, servePort)
	} else if cp, ok := containerPort(engine, intstr.FromInt(n)); !ok || cp.Name != "http" {
		t.Errorf("%s: declare the serving port %d as \"http\"", where, n)
	}
	served := engineFlags["served-model-name"]
	for _, k := range bridges {
		if served == "" || k.Flags["model"] != served {
			t.Errorf("%s: --model=%q must be the engine's --served-model-name %q", k, k.Flags["model"], served)
		}
		if want := net.JoinHostPort(podIPPlaceholder, servePort); k.Flags["pod"] != want {
			t.Errorf("%s: --pod expands to %q, want the pod IP and the serving port %q (what the router calls the endpoint)", k, k.Flags["pod"], want)
		}
	}
}

// TestBridgeHeartbeats: every bridge heartbeats at least 3 times per
// ingester liveness window (effective values, defaults included, across
// all builds: they meet in one cluster), so one late heartbeat does not
// drop a live endpoint.
func TestBridgeHeartbeats(t *testing.T) {
	var bridges, ingesters []*kvContainer
	for _, b := range okBuilds(t) {
		kcs, _ := kvContainers(b)
		for _, k := range kcs {
			switch {
			case k.Cmd == nil:
			case k.Role == "bridge":
				bridges = append(bridges, k)
			case k.Role == "ingester":
				ingesters = append(ingesters, k)
			}
		}
	}
	if len(bridges) == 0 || len(ingesters) == 0 {
		t.Fatalf("%d bridges and %d ingesters in the builds; want some of each", len(bridges), len(ingesters))
	}
	for _, br := range bridges {
		hb, err := br.Cmd.Flags().GetDuration("heartbeat-interval")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range ingesters {
			window, err := in.Cmd.Flags().GetDuration("liveness-window")
			if err != nil {
				t.Fatal(err)
			}
			if 3*hb > window {
				t.Errorf("%s: --heartbeat-interval %v is over a third of %s's --liveness-window %v", br, hb, in, window)
			}
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

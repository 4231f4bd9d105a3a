package deploy

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

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

// TestModelServerSidecar checks every pod that runs a kvindex bridge: the
// engine beside it publishes KV events where the bridge subscribes, with
// the hashing routers can reproduce, and the bridge names the endpoint and
// model the way the router does.
func TestModelServerSidecar(t *testing.T) {
	var checked int
	for _, b := range okBuilds(t) {
		kcs, _ := kvContainers(b)
		for _, k := range kcs {
			if k.Role != "bridge" {
				continue
			}
			checked++
			t.Run(b.Dir+"/"+k.W.Name, func(t *testing.T) {
				checkSidecar(t, b, k)
			})
		}
	}
	if checked == 0 {
		t.Fatal("no build runs a kvindex bridge (examples/vllm-sidecar should)")
	}
}

func checkSidecar(t *testing.T, b *build, k *kvContainer) {
	t.Helper()
	w := k.W
	isSidecar := slices.ContainsFunc(w.Template.Spec.InitContainers, func(c corev1.Container) bool {
		return c.Name == k.C.Name && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
	})
	if !isSidecar {
		t.Errorf("%s: run the bridge as a native sidecar (init container, restartPolicy: Always) so it outlives the engine at shutdown", k)
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
		t.Fatalf("%s: no container in the pod passes --kv-events-config", k)
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
	for _, pair := range []struct{ engineEP, bridgeFlag, portName string }{
		{cfg.Endpoint, "zmq", "kv-events"},
		{deref(cfg.ReplayEndpoint), "replay", "kv-replay"},
	} {
		if pair.engineEP == "" {
			t.Errorf("%s: set %s's endpoint in --kv-events-config (the bridge heals gaps from it)", where, pair.bridgeFlag)
			continue
		}
		_, ePort, err := zmqPort(pair.engineEP)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		host, bPort, err := zmqPort(k.Flags[pair.bridgeFlag])
		if err != nil {
			t.Errorf("%s: --%s: %v", k, pair.bridgeFlag, err)
			continue
		}
		if !isLoopback(host) || bPort != ePort {
			t.Errorf("%s: --%s=%s, want the engine's port %d on the pod's loopback", k, pair.bridgeFlag, k.Flags[pair.bridgeFlag], ePort)
		}
		if cp, ok := containerPort(engine, intstr.FromInt32(ePort)); !ok || cp.Name != pair.portName {
			t.Errorf("%s: declare port %d as %q", where, ePort, pair.portName)
		}
	}

	// Engine-hash mode: hashes a router can reproduce.
	if _, ok := engineFlags["enable-prefix-caching"]; !ok {
		t.Errorf("%s: --enable-prefix-caching must be on", where)
	}
	if engineFlags["prefix-caching-hash-algo"] != "sha256_cbor" {
		t.Errorf("%s: --prefix-caching-hash-algo=%q; sha256_cbor is the one routers reproduce (DESIGN, \"Hashing\")", where, engineFlags["prefix-caching-hash-algo"])
	}
	if _, err := strconv.ParseUint(engineEnv["PYTHONHASHSEED"], 10, 32); err != nil {
		t.Errorf("%s: PYTHONHASHSEED=%q; fix it to a number so block hashes are reproducible", where, engineEnv["PYTHONHASHSEED"])
	}
	if engineFlags["block-size"] == "" {
		t.Errorf("%s: set --block-size; routers hash with the same block size", where)
	}

	// Identity: the model routers route by, and the endpoint they see.
	if served := engineFlags["served-model-name"]; served == "" || k.Flags["model"] != served {
		t.Errorf("%s: --model=%q must be the engine's --served-model-name %q", k, k.Flags["model"], served)
	}
	servePort := engineFlags["port"]
	if servePort == "" {
		t.Errorf("%s: set --port explicitly; the bridge's --pod names it", where)
	} else if n, err := strconv.Atoi(servePort); err != nil {
		t.Errorf("%s: --port=%q", where, servePort)
	} else if cp, ok := containerPort(engine, intstr.FromInt(n)); !ok || cp.Name != "http" {
		t.Errorf("%s: declare the serving port %d as \"http\"", where, n)
	}
	if want := net.JoinHostPort(podIPPlaceholder, servePort); k.Flags["pod"] != want {
		t.Errorf("%s: --pod expands to %q, want the pod IP and the serving port %q (what the router calls the endpoint)", k, k.Flags["pod"], want)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

package deploy

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestLLMDExample checks the central bridge of examples/llm-d:
// it binds the port its Service forwards, the fleet's KV-event endpoint
// names that Service and port, its replay pattern names the port the
// fleet's replay endpoint binds, it reads llm-d's topic convention, it runs
// as one replica replaced by Recreate (one producer per pod stream), and
// its pod's grace covers the shutdown flush.
func TestLLMDExample(t *testing.T) {
	var b *build
	for _, x := range okBuilds(t) {
		if x.Dir == "examples/llm-d" {
			b = x
		}
	}
	if b == nil {
		t.Fatal("no examples/llm-d build")
	}
	kcs, _ := kvContainers(b)
	var bridges []*kvContainer
	for _, k := range kcs {
		if k.Role == "bridge" && k.Cmd != nil {
			bridges = append(bridges, k)
		}
	}
	if len(bridges) != 1 {
		t.Fatalf("%d bridge containers, want 1", len(bridges))
	}
	k := bridges[0]
	flag := func(name string) string {
		t.Helper()
		v, err := k.Cmd.Flags().GetString(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	bind := flag("zmq-bind")
	if bind == "" {
		t.Fatalf("%s: no --zmq-bind", k)
	}
	_, bindPort, err := net.SplitHostPort(strings.TrimPrefix(bind, "tcp://"))
	if err != nil {
		t.Fatalf("%s: --zmq-bind %q: %v", k, bind, err)
	}
	if got := flag("topic-pattern"); got != "kv@{pod}@{model}" {
		t.Errorf("%s: --topic-pattern %q, want llm-d's kv@{pod}@{model}", k, got)
	}

	// The container port the Service targets is the bound one.
	var svc *corev1.Service
	for _, s := range typed[corev1.Service](b) {
		if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(k.W.Template.Labels)) {
			svc = s
		}
	}
	if svc == nil {
		t.Fatalf("no Service selects %s", k.W)
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service %s has %d ports, want 1 (the KV-event port)", svc.Name, len(svc.Spec.Ports))
	}
	sp := svc.Spec.Ports[0]
	var target int32
	for _, p := range k.C.Ports {
		if p.Name == sp.TargetPort.String() || (sp.TargetPort.IntVal != 0 && p.ContainerPort == sp.TargetPort.IntVal) {
			target = p.ContainerPort
		}
	}
	if target == 0 || bindPort != itoa(target) {
		t.Errorf("Service %s targets container port %d, the bridge binds %s", svc.Name, target, bindPort)
	}

	// The fleet's endpoint names the Service and its port; its replay
	// endpoint binds the port the replay pattern dials.
	var fleet map[string]any
	for _, cm := range typed[corev1.ConfigMap](b) {
		if strings.HasPrefix(cm.Name, "fleet-kv-events-config") {
			if err := json.Unmarshal([]byte(cm.Data["kv-events-config"]), &fleet); err != nil {
				t.Fatalf("ConfigMap %s: kv-events-config: %v", cm.Name, err)
			}
		}
	}
	if fleet == nil {
		t.Fatal("no fleet-kv-events-config ConfigMap")
	}
	ep, _ := fleet["endpoint"].(string)
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil || (host != svc.Name && !strings.HasPrefix(host, svc.Name+".")) || port != itoa(sp.Port) {
		t.Errorf("fleet endpoint %q, want tcp://%s:%d (the bridge's Service)", ep, svc.Name, sp.Port)
	}
	rep, _ := fleet["replay_endpoint"].(string)
	_, replayPort, err1 := net.SplitHostPort(strings.TrimPrefix(rep, "tcp://"))
	_, patternPort, err2 := net.SplitHostPort(strings.TrimPrefix(flag("replay-pattern"), "tcp://"))
	if err1 != nil || err2 != nil || replayPort != patternPort {
		t.Errorf("fleet replay_endpoint %q and --replay-pattern %q name different ports", rep, flag("replay-pattern"))
	}

	// One producer per pod stream.
	var dep *appsv1.Deployment
	for _, d := range typed[appsv1.Deployment](b) {
		if d.Name == k.W.Name {
			dep = d
		}
	}
	if dep == nil || k.W.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("%s: want 1 replica replaced by Recreate (two bridges would both produce a pod whose reconnection changed replica)", k.W)
	}
	flush, err := k.Cmd.Flags().GetDuration("flush-timeout")
	if err != nil {
		t.Fatal(err)
	}
	if g := k.W.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= flush {
		t.Errorf("%s: terminationGracePeriodSeconds must exceed --flush-timeout (%v)", k.W, flush)
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

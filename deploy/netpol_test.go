package deploy

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// peer is a traffic source: a pod (namespace, its labels, the pod's
// labels) or, with external set, the node (kubelet probes) or anything
// outside the cluster.
type peer struct {
	name      string
	namespace string
	podLabels map[string]string
	external  bool
}

// nsLabels are the labels the API server puts on every namespace.
func (p peer) nsLabels() map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": p.namespace}
}

// labelSelectorMatches is LabelSelector semantics for NetworkPolicy
// peers and podSelector: an empty selector matches everything.
func labelSelectorMatches(sel *metav1.LabelSelector, l map[string]string) (bool, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(l)), nil
}

// admits evaluates the NetworkPolicy API's ingress semantics: traffic to
// port of a pod of w from p is allowed when no policy selects the pod
// for Ingress, or when a rule of a policy that does allows both the port
// and the peer. It covers what the manifests use: podSelector,
// namespaceSelector (alone or together), ipBlock (any external source
// when its CIDR is 0.0.0.0/0 or ::/0), numbered and named ports.
func admits(pols []*networkingv1.NetworkPolicy, w *workload, port corev1.ContainerPort, p peer) (bool, error) {
	selected := false
	for _, pol := range pols {
		if namespaceOf(pol.Namespace) != w.Namespace {
			continue
		}
		ok, err := labelSelectorMatches(&pol.Spec.PodSelector, w.Template.Labels)
		if err != nil {
			return false, err
		}
		ingress := len(pol.Spec.PolicyTypes) == 0 || slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		if !ok || !ingress {
			continue
		}
		selected = true
		for _, rule := range pol.Spec.Ingress {
			if !portAllowed(rule.Ports, port) {
				continue
			}
			if len(rule.From) == 0 {
				return true, nil
			}
			for _, from := range rule.From {
				ok, err := peerMatches(from, pol.Namespace, p)
				if err != nil || ok {
					return ok, err
				}
			}
		}
	}
	return !selected, nil
}

func portAllowed(ports []networkingv1.NetworkPolicyPort, cp corev1.ContainerPort) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		cproto := cp.Protocol
		if cproto == "" {
			cproto = corev1.ProtocolTCP
		}
		if proto != cproto {
			continue
		}
		if pp.Port == nil || (pp.Port.IntVal != 0 && pp.Port.IntVal == cp.ContainerPort) || (pp.Port.StrVal != "" && pp.Port.StrVal == cp.Name) {
			return true
		}
	}
	return false
}

func peerMatches(from networkingv1.NetworkPolicyPeer, policyNS string, p peer) (bool, error) {
	if from.IPBlock != nil {
		return p.external && (from.IPBlock.CIDR == "0.0.0.0/0" || from.IPBlock.CIDR == "::/0"), nil
	}
	if p.external {
		return false, nil
	}
	if from.NamespaceSelector != nil {
		ok, err := labelSelectorMatches(from.NamespaceSelector, p.nsLabels())
		if err != nil || !ok {
			return false, err
		}
	} else if p.namespace != namespaceOf(policyNS) {
		return false, nil // a podSelector alone means the policy's namespace
	}
	if from.PodSelector != nil {
		return labelSelectorMatches(from.PodSelector, p.podLabels)
	}
	return true, nil
}

// TestNetworkPolicies checks, for every build that runs kvindex's
// cluster roles, who reaches which port (docs/security.md, "Network
// policy"): routers alone reach indexd's API, anyone reaches its
// plaintext health port (kubelet), the ingesters and indexd reach etcd's
// client port, etcd members its peer port, the monitoring namespace
// every metrics port; nobody else reaches anything.
func TestNetworkPolicies(t *testing.T) {
	for _, b := range okBuilds(t) {
		indexds, ingesters, etcds := byComponent(b, "indexd"), byComponent(b, "ingester"), byComponent(b, "etcd")
		if len(indexds) == 0 && len(ingesters) == 0 && len(etcds) == 0 {
			continue
		}
		t.Run(b.Dir, func(t *testing.T) {
			if len(indexds) != 1 || len(ingesters) != 1 || len(etcds) != 1 {
				t.Fatalf("want one indexd, ingester and etcd workload, got %d, %d, %d", len(indexds), len(ingesters), len(etcds))
			}
			pols := typed[networkingv1.NetworkPolicy](b)
			ns := indexds[0].Namespace
			podOf := func(name string, w *workload) peer {
				return peer{name: name, namespace: w.Namespace, podLabels: w.Template.Labels}
			}
			var (
				router     = peer{name: "router", namespace: "routers", podLabels: map[string]string{"kvindex.io/client": "true"}}
				stranger   = peer{name: "stranger", namespace: "routers", podLabels: map[string]string{"app": "other"}}
				neighbour  = peer{name: "unlabelled pod in the kvindex namespace", namespace: ns, podLabels: map[string]string{"app": "other"}}
				monitoring = peer{name: "prometheus", namespace: "monitoring", podLabels: map[string]string{"app": "prometheus"}}
				node       = peer{name: "node", external: true}
				indexd     = podOf("indexd", indexds[0])
				ingester   = podOf("ingester", ingesters[0])
				etcd       = podOf("etcd", etcds[0])
				everyone   = []peer{router, stranger, neighbour, monitoring, node, indexd, ingester, etcd}
			)
			allowed := map[string]map[string][]peer{
				"indexd":   {"grpc": {router}, "health": everyone, "metrics": {monitoring}},
				"ingester": {"metrics": {monitoring}},
				"etcd":     {"client": {ingester, indexd}, "peer": {etcd}, "metrics": {monitoring}},
			}
			for _, w := range []*workload{indexds[0], ingesters[0], etcds[0]} {
				for _, c := range w.Containers() {
					for _, cp := range c.Ports {
						want := allowed[w.Component()][cp.Name]
						for _, p := range everyone {
							got, err := admits(pols, w, cp, p)
							if err != nil {
								t.Fatal(err)
							}
							if wantOK := slices.ContainsFunc(want, func(q peer) bool { return q.name == p.name }); got != wantOK {
								t.Errorf("%s port %s (%d) from %s: allowed=%v, want %v", w, cp.Name, cp.ContainerPort, p.name, got, wantOK)
							}
						}
					}
				}
			}
			// Every port a policy names exists on a pod it selects, so a
			// renamed port cannot silently close (or open) a rule.
			for _, pol := range pols {
				for _, w := range workloads(b) {
					ok, err := labelSelectorMatches(&pol.Spec.PodSelector, w.Template.Labels)
					if err != nil || !ok || namespaceOf(pol.Namespace) != w.Namespace {
						continue
					}
					for _, rule := range pol.Spec.Ingress {
						for _, pp := range rule.Ports {
							if pp.Port == nil {
								continue
							}
							if _, ok := podPort(w, *pp.Port); !ok {
								t.Errorf("NetworkPolicy %s names port %s, which %s does not declare", pol.Name, pp.Port.String(), w)
							}
						}
					}
				}
			}
		})
	}
}

// TestAdmitsCanRefuse proves the evaluator above is not vacuous: with the
// default-deny policy alone, nothing reaches indexd; with no policy,
// everything does.
func TestAdmitsCanRefuse(t *testing.T) {
	w := &workload{Kind: "Deployment", Name: "x", Namespace: namespaceOf(""), Template: &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{labelName: "kvindex", labelComponent: "indexd"}}}}
	cp := corev1.ContainerPort{Name: "grpc", ContainerPort: 50051}
	deny := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelName: "kvindex"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	p := peer{name: "router", namespace: "routers", podLabels: map[string]string{"kvindex.io/client": "true"}}
	for _, tc := range []struct {
		pols []*networkingv1.NetworkPolicy
		want bool
	}{{nil, true}, {[]*networkingv1.NetworkPolicy{deny}, false}} {
		got, err := admits(tc.pols, w, cp, p)
		if err != nil || got != tc.want {
			t.Errorf("%d policies: admits = %v, %v; want %v", len(tc.pols), got, err, tc.want)
		}
	}
}

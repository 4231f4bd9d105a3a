package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// externalSecrets are Secrets the manifests mount but do not create, with
// the keys deploy/README.md says they hold; the operator creates them.
var externalSecrets = map[string][]string{
	"kvindex-etcd-tls":        {"ca.crt", "tls.crt", "tls.key"},
	"kvindex-etcd-client-tls": {"ca.crt", "tls.crt", "tls.key"},
	// components/indexd-tls, etcd-auth and kafka-tls-sasl
	// (docs/security.md, "Secrets").
	"kvindex-indexd-tls":         {"ca.crt", "tls.crt", "tls.key"},
	"kvindex-etcd-ingester-auth": {"password"},
	"kvindex-etcd-indexd-auth":   {"password"},
	"kvindex-cluster-ca-cert":    {"ca.crt"},
	"kvindex-ingester":           {"password"},
	"kvindex-bridge":             {"password"},
}

// rootExempt lists containers, by name, allowed to run as root with a
// writable root filesystem, and why. Everything else runs as non-root on a
// read-only root.
var rootExempt = map[string]string{
	"vllm": "the vLLM image runs as root and writes caches outside its volumes",
}

func TestObjectMetadata(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			namespaces := map[string]bool{}
			var nsObjects []string
			for _, o := range b.Objects {
				var errs []string
				switch o.Kind {
				case "Service", "Namespace":
					errs = validation.IsDNS1123Label(o.Name)
				default:
					errs = validation.IsDNS1123Subdomain(o.Name)
				}
				for _, e := range errs {
					t.Errorf("%s: name: %s", o, e)
				}
				if o.Kind == "Namespace" {
					nsObjects = append(nsObjects, o.Name)
				} else {
					namespaces[o.Namespace] = true
				}
				meta := objectMeta(o)
				if meta == nil {
					continue
				}
				for k, v := range meta.Labels {
					for _, e := range slices.Concat(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)) {
						t.Errorf("%s: label %s=%s: %s", o, k, v, e)
					}
				}
				for k := range meta.Annotations {
					for _, e := range validation.IsQualifiedName(k) {
						t.Errorf("%s: annotation %s: %s", o, k, e)
					}
				}
				if meta.Labels[labelName] == "kvindex" && meta.Labels[labelPartOf] != "kvindex" {
					t.Errorf("%s: labelled %s=kvindex but not %s=kvindex", o, labelName, labelPartOf)
				}
			}
			if len(namespaces) > 1 {
				t.Errorf("objects in more than one namespace: %v", keys(namespaces))
			}
			for _, ns := range nsObjects {
				if !namespaces[ns] {
					t.Errorf("Namespace %s is created but the objects are in %v", ns, keys(namespaces))
				}
			}
		})
	}
}

func TestWorkloadSelectors(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			ws := workloads(b)
			for _, w := range ws {
				ok, err := selects(w.Selector, w.Template.Labels)
				if err != nil {
					t.Errorf("%s: selector: %v", w, err)
				} else if !ok {
					t.Errorf("%s: selector %v does not match its pod template's labels %v", w, w.Selector, w.Template.Labels)
				}
				for _, k := range []string{labelName, labelComponent} {
					if v, ok := w.Template.Labels[k]; ok && w.Labels[k] != v {
						t.Errorf("%s: label %s is %q on the object but %q on its pods", w, k, w.Labels[k], v)
					}
				}
				for _, other := range ws {
					if other == w {
						continue
					}
					if ok, _ := selects(w.Selector, other.Template.Labels); ok {
						t.Errorf("%s: selector also matches the pods of %s", w, other)
					}
				}
			}
		})
	}
}

func TestPodSpecs(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			for _, w := range workloads(b) {
				checkPod(t, b, w)
			}
		})
	}
}

func checkPod(t *testing.T, b *build, w *workload) {
	t.Helper()
	spec := &w.Template.Spec
	if (spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken) && !boundToRole(b, w.Namespace, spec.ServiceAccountName) {
		t.Errorf("%s: automountServiceAccountToken must be false (no role binding names its service account, so it has no Kubernetes API to call)", w)
	}
	podSC := spec.SecurityContext
	if podSC == nil {
		podSC = &corev1.PodSecurityContext{}
	}
	names := map[string]bool{}
	portNames := map[string]string{}
	portNumbers := map[string]string{}
	mounted := map[string]bool{}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	if w.STS != nil {
		for _, pvc := range w.STS.Spec.VolumeClaimTemplates {
			volumes[pvc.Name] = true
			mounted[pvc.Name] = false
		}
	}
	for _, c := range w.Containers() {
		where := fmt.Sprintf("%s container %s", w, c.Name)
		for _, e := range validation.IsDNS1123Label(c.Name) {
			t.Errorf("%s: name: %s", where, e)
		}
		if names[c.Name] {
			t.Errorf("%s: container name repeated", where)
		}
		names[c.Name] = true
		isInit := slices.ContainsFunc(spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.Name })
		sidecar := isInit && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		if isInit && !sidecar && (c.LivenessProbe != nil || c.ReadinessProbe != nil || c.StartupProbe != nil) {
			t.Errorf("%s: an init container that is not a sidecar (restartPolicy: Always) may not have probes", where)
		}

		// Ports: valid, unique in the pod (its containers share one network
		// namespace).
		for _, p := range c.Ports {
			if p.Name == "" {
				t.Errorf("%s: port %d has no name (probes and Services refer to ports by name)", where, p.ContainerPort)
			}
			for _, e := range validation.IsValidPortName(p.Name) {
				t.Errorf("%s: port name %q: %s", where, p.Name, e)
			}
			for _, e := range validation.IsValidPortNum(int(p.ContainerPort)) {
				t.Errorf("%s: port %d: %s", where, p.ContainerPort, e)
			}
			key := fmt.Sprintf("%d/%s", p.ContainerPort, protocol(p.Protocol))
			if prev, dup := portNumbers[key]; dup {
				t.Errorf("%s: port %s already declared by container %s", where, key, prev)
			}
			portNumbers[key] = c.Name
			if prev, dup := portNames[p.Name]; dup && p.Name != "" {
				t.Errorf("%s: port name %s already used by container %s", where, p.Name, prev)
			}
			portNames[p.Name] = c.Name
		}

		// Probes name ports the container declares.
		for kind, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if pr == nil {
				continue
			}
			switch {
			case pr.HTTPGet != nil:
				if _, ok := containerPort(c, pr.HTTPGet.Port); !ok {
					t.Errorf("%s: %s probe port %s is not a port of the container", where, kind, pr.HTTPGet.Port.String())
				}
				if !strings.HasPrefix(pr.HTTPGet.Path, "/") {
					t.Errorf("%s: %s probe path %q is not absolute", where, kind, pr.HTTPGet.Path)
				}
			case pr.GRPC != nil:
				if _, ok := containerPort(c, intstr.FromInt32(pr.GRPC.Port)); !ok {
					t.Errorf("%s: %s gRPC probe port %d is not a port of the container", where, kind, pr.GRPC.Port)
				}
			case pr.TCPSocket != nil:
				if _, ok := containerPort(c, pr.TCPSocket.Port); !ok {
					t.Errorf("%s: %s probe port %s is not a port of the container", where, kind, pr.TCPSocket.Port.String())
				}
			default:
				t.Errorf("%s: %s probe has no httpGet, grpc or tcpSocket handler", where, kind)
			}
		}
		if !isInit || sidecar {
			if c.LivenessProbe == nil {
				t.Errorf("%s: no liveness probe", where)
			}
		}

		// Images: pinned.
		if err := checkImageRef(c.Image); err != nil {
			t.Errorf("%s: %v", where, err)
		}

		// Resources.
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				t.Errorf("%s: no %s request", where, r)
			}
		}
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			t.Errorf("%s: no memory limit", where)
		}
		for r, lim := range c.Resources.Limits {
			if req, ok := c.Resources.Requests[r]; ok && req.Cmp(lim) > 0 {
				t.Errorf("%s: %s request %s exceeds its limit %s", where, r, req.String(), lim.String())
			}
		}

		// Security context.
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", where)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", where)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: capabilities must drop ALL and add none", where)
		}
		seccomp := podSC.SeccompProfile
		if sc.SeccompProfile != nil {
			seccomp = sc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccompProfile must be RuntimeDefault", where)
		}
		if why, exempt := rootExempt[c.Name]; exempt {
			t.Logf("%s: may run as root: %s", where, why)
		} else {
			nonRoot := podSC.RunAsNonRoot
			if sc.RunAsNonRoot != nil {
				nonRoot = sc.RunAsNonRoot
			}
			if nonRoot == nil || !*nonRoot {
				t.Errorf("%s: runAsNonRoot must be true", where)
			}
			uid := podSC.RunAsUser
			if sc.RunAsUser != nil {
				uid = sc.RunAsUser
			}
			if uid == nil || *uid == 0 {
				t.Errorf("%s: runAsUser must be a non-zero uid (the images' USER)", where)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("%s: readOnlyRootFilesystem must be true", where)
			}
		}

		// Variables and the references to them resolve.
		for _, podName := range w.PodNames() {
			env, problems := envResolver{b: b, w: w, podName: podName}.resolve(c)
			for _, p := range problems {
				t.Errorf("%s (pod %s): %s", where, podName, p)
			}
			_, unresolved := expandAll(slices.Concat(c.Command, c.Args), env)
			for _, u := range unresolved {
				t.Errorf("%s: command or args refer to $(%s), which the container does not define (the kubelet would pass it on literally)", where, u)
			}
		}

		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("%s: mounts volume %q, which the pod does not define", where, m.Name)
			}
			mounted[m.Name] = true
		}
	}
	for _, v := range spec.Volumes {
		if !mounted[v.Name] {
			t.Errorf("%s: volume %q is mounted by no container", w, v.Name)
		}
		if v.Secret != nil {
			documented, external := externalSecrets[v.Secret.SecretName]
			if !external && !hasObject(b, "Secret", v.Secret.SecretName) {
				t.Errorf("%s: volume %q: Secret %q is neither in the build nor a documented external Secret", w, v.Name, v.Secret.SecretName)
			}
			for _, item := range v.Secret.Items {
				if external && !slices.Contains(documented, item.Key) {
					t.Errorf("%s: volume %q projects key %q, which the documented Secret %s does not hold (%v)", w, v.Name, item.Key, v.Secret.SecretName, documented)
				}
			}
		}
		if v.ConfigMap != nil && configMap(b, v.ConfigMap.Name) == nil {
			t.Errorf("%s: volume %q: no ConfigMap %q in the build", w, v.Name, v.ConfigMap.Name)
		}
	}
	for name, used := range mounted {
		if !used {
			t.Errorf("%s: volume claim template %q is mounted by no container", w, name)
		}
	}
}

// checkImageRef requires a tag or a digest, and not "latest".
func checkImageRef(ref string) error {
	if _, digest, ok := strings.Cut(ref, "@"); ok {
		if !strings.HasPrefix(digest, "sha256:") {
			return fmt.Errorf("image %q: digest is not sha256", ref)
		}
		return nil
	}
	last := ref[strings.LastIndexByte(ref, '/')+1:]
	_, tag, ok := strings.Cut(last, ":")
	if !ok || tag == "" {
		return fmt.Errorf("image %q has no tag: pin one", ref)
	}
	if tag == "latest" {
		return fmt.Errorf("image %q: pin a version, not latest", ref)
	}
	return nil
}

func TestServices(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			ws := workloads(b)
			for _, svc := range typed[corev1.Service](b) {
				where := "Service " + svc.Name
				headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
				var matched []*workload
				for _, w := range ws {
					ok, err := selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, w.Template.Labels)
					if err != nil {
						t.Errorf("%s: selector: %v", where, err)
					}
					if ok {
						matched = append(matched, w)
					}
				}
				if len(matched) == 0 {
					t.Errorf("%s: selector %v matches no pods of the build", where, svc.Spec.Selector)
					continue
				}
				names := map[string]bool{}
				for _, p := range svc.Spec.Ports {
					for _, e := range validation.IsValidPortName(p.Name) {
						t.Errorf("%s: port name %q: %s", where, p.Name, e)
					}
					if names[p.Name] {
						t.Errorf("%s: port name %q repeated", where, p.Name)
					}
					names[p.Name] = true
					target := p.TargetPort
					if target.Type == intstr.Int && target.IntVal == 0 {
						target = intstr.FromInt32(p.Port)
					}
					for _, w := range matched {
						cp, ok := podPort(w, target)
						switch {
						case !ok:
							t.Errorf("%s: port %s targets %s, which pods of %s do not declare", where, p.Name, target.String(), w)
						case protocol(cp.Protocol) != protocol(p.Protocol):
							t.Errorf("%s: port %s is %s but %s's port is %s", where, p.Name, protocol(p.Protocol), w, protocol(cp.Protocol))
						case headless && cp.ContainerPort != p.Port:
							t.Errorf("%s: headless, so clients dial pods on port %d, but %s listens on %d", where, p.Port, w, cp.ContainerPort)
						}
					}
				}
			}
			for _, w := range ws {
				if w.STS == nil {
					continue
				}
				svc := service(b, w.STS.Spec.ServiceName)
				switch {
				case svc == nil:
					t.Errorf("%s: serviceName %q is no Service of the build", w, w.STS.Spec.ServiceName)
				case svc.Spec.ClusterIP != corev1.ClusterIPNone:
					t.Errorf("%s: serviceName %q is not headless", w, svc.Name)
				default:
					if ok, _ := selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, w.Template.Labels); !ok {
						t.Errorf("%s: its governing Service %s does not select its pods", w, svc.Name)
					}
				}
			}
		})
	}
}

func TestDisruptionBudgets(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			ws := workloads(b)
			covered := map[*workload]*policyv1.PodDisruptionBudget{}
			for _, pdb := range typed[policyv1.PodDisruptionBudget](b) {
				where := "PodDisruptionBudget " + pdb.Name
				if (pdb.Spec.MaxUnavailable == nil) == (pdb.Spec.MinAvailable == nil) {
					t.Errorf("%s: set exactly one of maxUnavailable and minAvailable", where)
				}
				var matched []*workload
				for _, w := range ws {
					ok, err := selects(pdb.Spec.Selector, w.Template.Labels)
					if err != nil {
						t.Errorf("%s: selector: %v", where, err)
					}
					if ok {
						matched = append(matched, w)
						covered[w] = pdb
					}
				}
				if len(matched) != 1 {
					t.Errorf("%s: selects the pods of %d workloads %v, want exactly 1", where, len(matched), matched)
				}
			}
			for _, w := range ws {
				if w.Labels[labelName] != "kvindex" {
					continue
				}
				pdb, ok := covered[w]
				if !ok {
					t.Errorf("%s: no PodDisruptionBudget", w)
					continue
				}
				if w.Component() == "etcd" && (pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1") {
					t.Errorf("%s: PodDisruptionBudget %s must set maxUnavailable: 1 (quorum)", w, pdb.Name)
				}
			}
		})
	}
}

func protocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func service(b *build, name string) *corev1.Service {
	for _, s := range typed[corev1.Service](b) {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func hasObject(b *build, kind, name string) bool {
	for _, o := range b.Objects {
		if o.Kind == kind && o.Name == name {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// objectMeta decodes the metadata of any object, typed or custom.
func objectMeta(o *object) *metav1.ObjectMeta {
	var h struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(o.YAML, &h); err != nil {
		return nil
	}
	return &h.Metadata
}

// boundToRole reports whether a RoleBinding or ClusterRoleBinding of the
// build names the service account sa of namespace ns (empty sa is
// "default"): only such a pod calls the Kubernetes API (the GIE example's
// endpoint picker watches its InferencePool and pods).
func boundToRole(b *build, ns, sa string) bool {
	if sa == "" {
		sa = "default"
	}
	names := func(subjects []rbacv1.Subject, bindingNS string) bool {
		for _, s := range subjects {
			sns := s.Namespace
			if sns == "" {
				sns = bindingNS
			}
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && namespaceOf(sns) == ns {
				return true
			}
		}
		return false
	}
	for _, rb := range typed[rbacv1.RoleBinding](b) {
		if names(rb.Subjects, rb.Namespace) {
			return true
		}
	}
	for _, crb := range typed[rbacv1.ClusterRoleBinding](b) {
		if names(crb.Subjects, "") {
			return true
		}
	}
	return false
}

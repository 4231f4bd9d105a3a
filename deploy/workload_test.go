package deploy

import (
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Label keys the manifests select on.
const (
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	labelPartOf    = "app.kubernetes.io/part-of"
)

// kvindexImage is the repository of the one kvindex image.
const kvindexImage = "ghcr.io/kvindex/kvindex"

// podIPPlaceholder stands for status.podIP when expanding variables
// (TEST-NET-1, a documentation address: nothing dials it).
const podIPPlaceholder = "192.0.2.10"

// workload is a Deployment or a StatefulSet: what owns pods.
type workload struct {
	Kind      string
	Name      string
	Namespace string
	Replicas  int32
	Selector  *metav1.LabelSelector
	Labels    map[string]string
	// Annotations are the workload object's own (not its pods').
	Annotations map[string]string
	Template    *corev1.PodTemplateSpec
	// STS is set for StatefulSets.
	STS *appsv1.StatefulSet
}

func (w *workload) String() string { return w.Kind + " " + w.Name }

// Component is the workload's app.kubernetes.io/component label.
func (w *workload) Component() string { return w.Template.Labels[labelComponent] }

// PodNames are the names of the pods the workload runs: a StatefulSet's
// ordinals, or one stand-in name for a Deployment.
func (w *workload) PodNames() []string {
	if w.STS != nil {
		var names []string
		for i := range w.Replicas {
			names = append(names, fmt.Sprintf("%s-%d", w.Name, i))
		}
		return names
	}
	return []string{w.Name + "-5d8f9c7b6d-x2x4q"}
}

// Containers returns every container of the pod: init containers (native
// sidecars among them) first, then the main ones.
func (w *workload) Containers() []*corev1.Container {
	var out []*corev1.Container
	for i := range w.Template.Spec.InitContainers {
		out = append(out, &w.Template.Spec.InitContainers[i])
	}
	for i := range w.Template.Spec.Containers {
		out = append(out, &w.Template.Spec.Containers[i])
	}
	return out
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func namespaceOf(ns string) string {
	if ns == "" {
		return "default"
	}
	return ns
}

func workloads(b *build) []*workload {
	var out []*workload
	for _, d := range typed[appsv1.Deployment](b) {
		out = append(out, &workload{Kind: "Deployment", Name: d.Name, Namespace: namespaceOf(d.Namespace), Replicas: replicas(d.Spec.Replicas),
			Selector: d.Spec.Selector, Labels: d.Labels, Annotations: d.Annotations, Template: &d.Spec.Template})
	}
	for _, s := range typed[appsv1.StatefulSet](b) {
		out = append(out, &workload{Kind: "StatefulSet", Name: s.Name, Namespace: namespaceOf(s.Namespace), Replicas: replicas(s.Spec.Replicas),
			Selector: s.Spec.Selector, Labels: s.Labels, Annotations: s.Annotations, Template: &s.Spec.Template, STS: s})
	}
	return out
}

// byComponent returns the workloads of b whose pods carry the given
// component label.
func byComponent(b *build, component string) []*workload {
	var out []*workload
	for _, w := range workloads(b) {
		if w.Component() == component {
			out = append(out, w)
		}
	}
	return out
}

// selects reports whether selector matches the pod labels. A nil or empty
// selector matches nothing (an API error for workloads and PDBs, and a
// Service without endpoints).
func selects(selector *metav1.LabelSelector, podLabels map[string]string) (bool, error) {
	if selector == nil || (len(selector.MatchLabels) == 0 && len(selector.MatchExpressions) == 0) {
		return false, nil
	}
	s, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(podLabels)), nil
}

func configMap(b *build, name string) *corev1.ConfigMap {
	for _, cm := range typed[corev1.ConfigMap](b) {
		if cm.Name == name {
			return cm
		}
	}
	return nil
}

// envResolver resolves a container's environment as the kubelet would for
// one pod, with the values of this build.
type envResolver struct {
	b       *build
	w       *workload
	podName string
}

// resolve returns the container's variables in order, and a problem for
// every reference that would not resolve in a cluster (a missing ConfigMap
// or key, an unknown field path, a $(VAR) naming no earlier variable).
// Secrets are external: secretKeyRef values resolve to a placeholder.
func (r envResolver) resolve(c *corev1.Container) (map[string]string, []string) {
	env := map[string]string{}
	var problems []string
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef != nil {
			cm := configMap(r.b, from.ConfigMapRef.Name)
			if cm == nil {
				problems = append(problems, fmt.Sprintf("envFrom: no ConfigMap %q in the build", from.ConfigMapRef.Name))
				continue
			}
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			v, unresolved := expand(e.Value, lookup)
			for _, u := range unresolved {
				problems = append(problems, fmt.Sprintf("env %s: $(%s) names no variable defined before it", e.Name, u))
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			switch p := e.ValueFrom.FieldRef.FieldPath; p {
			case "metadata.name":
				env[e.Name] = r.podName
			case "metadata.namespace":
				env[e.Name] = r.w.Namespace
			case "status.podIP":
				env[e.Name] = podIPPlaceholder
			case "spec.nodeName", "spec.serviceAccountName", "status.hostIP", "metadata.uid":
				env[e.Name] = "<" + p + ">"
			default:
				problems = append(problems, fmt.Sprintf("env %s: field path %q is not one the downward API offers as a variable here", e.Name, p))
			}
		case e.ValueFrom.ResourceFieldRef != nil:
			ref := e.ValueFrom.ResourceFieldRef
			target := c
			if ref.ContainerName != "" {
				target = nil
				for _, cc := range r.w.Containers() {
					if cc.Name == ref.ContainerName {
						target = cc
					}
				}
			}
			if target == nil {
				problems = append(problems, fmt.Sprintf("env %s: resourceFieldRef names no container %q", e.Name, ref.ContainerName))
				continue
			}
			kind, res, _ := strings.Cut(ref.Resource, ".")
			list := target.Resources.Requests
			if kind == "limits" {
				list = target.Resources.Limits
			}
			q, ok := list[corev1.ResourceName(res)]
			if !ok {
				problems = append(problems, fmt.Sprintf("env %s: container %s sets no %s", e.Name, target.Name, ref.Resource))
				continue
			}
			env[e.Name] = strconv.FormatInt(q.Value(), 10)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := configMap(r.b, ref.Name)
			optional := ref.Optional != nil && *ref.Optional
			switch {
			case cm == nil && !optional:
				problems = append(problems, fmt.Sprintf("env %s: no ConfigMap %q in the build", e.Name, ref.Name))
			case cm != nil:
				v, ok := cm.Data[ref.Key]
				if !ok && !optional {
					problems = append(problems, fmt.Sprintf("env %s: ConfigMap %s has no key %q", e.Name, ref.Name, ref.Key))
				}
				if ok {
					env[e.Name] = v
				}
			}
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "<secret " + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key + ">"
		default:
			problems = append(problems, fmt.Sprintf("env %s: valueFrom with no source", e.Name))
		}
	}
	return env, problems
}

// expandAll expands the container's command and args with env.
func expandAll(words []string, env map[string]string) ([]string, []string) {
	var out, unresolved []string
	for _, w := range words {
		v, u := expand(w, func(n string) (string, bool) { s, ok := env[n]; return s, ok })
		out = append(out, v)
		unresolved = append(unresolved, u...)
	}
	return out, unresolved
}

// expand replaces $(NAME) references the way the kubelet does in command,
// args and env values: $$ is a literal $, a reference to a defined
// variable becomes its value, and any other reference stays as written.
// It returns the names of the references that stayed.
func expand(s string, lookup func(string) (string, bool)) (string, []string) {
	var out strings.Builder
	var unresolved []string
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			out.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			out.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				out.WriteString(s[i:])
				return out.String(), unresolved
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				out.WriteString(v)
			} else {
				out.WriteString(s[i : i+3+end])
				unresolved = append(unresolved, name)
			}
			i += 2 + end
		default:
			out.WriteByte('$')
		}
	}
	return out.String(), unresolved
}

// containerPort finds the port of c that a probe or Service names: by
// number or by name. ok is false when c declares no such port.
func containerPort(c *corev1.Container, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) || (p.Type == intstr.String && cp.Name == p.StrVal) {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

// podPort finds the port a Service's targetPort names among all the pod's
// containers.
func podPort(w *workload, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, c := range w.Containers() {
		if cp, ok := containerPort(c, p); ok {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

// flagValues parses "--name=value" args into a map, after the first
// positional word (the subcommand). It reports args of another form: the
// manifests always use --name=value so that a value is never mistaken for
// a flag.
func flagValues(args []string) (sub string, flags map[string]string, bad []string) {
	flags = map[string]string{}
	for i, a := range args {
		if i == 0 && !strings.HasPrefix(a, "-") {
			sub = a
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok || name == "" {
			bad = append(bad, a)
			continue
		}
		if _, dup := flags[name]; dup {
			bad = append(bad, a+" (repeated)")
		}
		flags[name] = value
	}
	return sub, flags, bad
}

// portOf returns the port of a host:port listen address.
func portOf(addr string) (int32, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("%q has no port", addr)
	}
	p, err := strconv.ParseInt(addr[i+1:], 10, 32)
	if err != nil || p <= 0 || p > 65535 {
		return 0, fmt.Errorf("%q has no valid port", addr)
	}
	return int32(p), nil
}

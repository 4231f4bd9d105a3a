package deploy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/kvindex/kvindex/internal/testutil"
)

// requiredBuilds are the kustomizations the deploy issue asks for; the test
// fails if one disappears. Every other kustomization found under deploy/ is
// built and checked too.
var requiredBuilds = []string{
	"base",
	"overlays/dev",
	"overlays/prod",
	"overlays/prod-tls",
	"overlays/strimzi",
	"examples/vllm-sidecar",
	"examples/vllm-sidecar-dp",
	"examples/llm-d",
	"examples/monitoring",
	"examples/monitoring-models",
}

// object is one resource of a build's output.
type object struct {
	APIVersion string
	Kind       string
	Name       string
	Namespace  string
	// YAML is the object as kustomize emitted it.
	YAML []byte
	// Typed is a pointer to the decoded struct (*appsv1.Deployment, ...,
	// or one of the Strimzi structs in strimzi_test.go); nil when the
	// object failed to decode (DecodeErr says why).
	Typed     any
	DecodeErr error
}

func (o *object) String() string { return fmt.Sprintf("%s %s/%s", o.Kind, o.Namespace, o.Name) }

// build is the output of one kustomization.
type build struct {
	// Dir is the kustomization's directory relative to deploy/, with
	// slashes.
	Dir     string
	Objects []*object
	// Err is kustomize's error; Objects is empty then.
	Err error
}

// decoders maps apiVersion/kind to a constructor of the struct that kind
// decodes into. A kind that is not listed fails the test: every kind the
// manifests use must be checked by something.
var decoders = map[string]func() any{
	"v1/Namespace":                                    func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                                    func() any { return &corev1.ConfigMap{} },
	"v1/Service":                                      func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                              func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                             func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":                   func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":              func() any { return &networkingv1.NetworkPolicy{} },
	"v1/ServiceAccount":                               func() any { return &corev1.ServiceAccount{} },
	"rbac.authorization.k8s.io/v1/Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"kafka.strimzi.io/v1/Kafka":                       func() any { return &strimziKafka{} },
	"kafka.strimzi.io/v1/KafkaNodePool":               func() any { return &strimziNodePool{} },
	"kafka.strimzi.io/v1/KafkaTopic":                  func() any { return &strimziTopic{} },
	"monitoring.coreos.com/v1/PodMonitor":             func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/ServiceMonitor":         func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":         func() any { return &monitoringv1.PrometheusRule{} },
}

// checkedElsewhere lists the kinds this module cannot decode because their
// types live in a module it must not require, each with the test that
// checks them instead. GIE's InferencePool (deploy/examples/gie) is
// checked against the CRD shipped in the GIE module by router/gie's
// TestInferencePoolMatchesTheCRD (the deploy module's k8s.io versions
// and GIE's client-go cannot share a module graph).
var checkedElsewhere = map[string]string{
	"inference.networking.k8s.io/v1/InferencePool": "router/gie TestInferencePoolMatchesTheCRD",
}

var (
	loadOnce   sync.Once
	loaded     []*build
	loadErr    error
	deployRoot string
)

// builds returns every kustomization under deploy/ built and decoded, in
// directory order. It builds once per test binary.
func builds(t *testing.T) []*build {
	t.Helper()
	loadOnce.Do(func() {
		deployRoot = filepath.Join(testutil.RepoRoot(t), "deploy")
		loaded, loadErr = buildAll(deployRoot)
	})
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	if len(loaded) == 0 {
		t.Fatal("no kustomization found under deploy/")
	}
	return loaded
}

// kustomizationFile is the subset of a kustomization.yaml the test reads
// itself (kustomize reads all of it).
type kustomizationFile struct {
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Components []string `json:"components"`
}

// kustomizationDirs returns every directory under root holding a
// kustomization.yaml, relative with slashes, split into buildable
// kustomizations and components.
func kustomizationDirs(root string) (kustomizations, components []string, err error) {
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "kustomization.yaml" {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		k, err := readKustomization(filepath.Dir(path))
		if err != nil {
			return err
		}
		if k.Kind == "Component" {
			components = append(components, filepath.ToSlash(rel))
		} else {
			kustomizations = append(kustomizations, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Strings(kustomizations)
	sort.Strings(components)
	return kustomizations, components, err
}

func readKustomization(dir string) (*kustomizationFile, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomizationFile
	// Not strict: kustomize itself validates the rest of the file.
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return &k, nil
}

// buildAll runs kustomize on every kustomization under root, on the real
// file system, with kustomize's default options: load restrictions to the
// kustomization root, no plugins. Remote bases are rejected before
// kustomize sees them, so nothing touches the network.
func buildAll(root string) ([]*build, error) {
	dirs, _, err := kustomizationDirs(root)
	if err != nil {
		return nil, err
	}
	fsys := filesys.MakeFsOnDisk()
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	var out []*build
	for _, dir := range dirs {
		b := &build{Dir: dir}
		out = append(out, b)
		k, err := readKustomization(filepath.Join(root, dir))
		if err != nil {
			b.Err = err
			continue
		}
		if remote := remoteRefs(k); len(remote) > 0 {
			b.Err = fmt.Errorf("remote bases or resources (the build must work offline): %v", remote)
			continue
		}
		rm, err := krusty.MakeKustomizer(opts).Run(fsys, filepath.Join(root, dir))
		if err != nil {
			b.Err = err
			continue
		}
		for _, r := range rm.Resources() {
			data, err := r.AsYAML()
			if err != nil {
				b.Err = err
				break
			}
			o := &object{
				APIVersion: r.GetApiVersion(),
				Kind:       r.GetKind(),
				Name:       r.GetName(),
				Namespace:  r.GetNamespace(),
				YAML:       data,
			}
			o.Typed, o.DecodeErr = decodeStrict(o)
			b.Objects = append(b.Objects, o)
		}
	}
	return out, nil
}

// remoteRefs returns the resources and components of k that are not local
// paths.
func remoteRefs(k *kustomizationFile) []string {
	var remote []string
	for _, r := range slices.Concat(k.Resources, k.Components) {
		if strings.Contains(r, "://") || strings.HasPrefix(r, "github.com/") || strings.HasPrefix(r, "git@") {
			remote = append(remote, r)
		}
	}
	return remote
}

// decodeStrict decodes o into the struct its kind maps to the way the API
// server does: YAML to JSON rejecting duplicate keys, then case-sensitive
// JSON decoding (sigs.k8s.io/json, which the apimachinery serializers use)
// rejecting unknown and duplicate fields. encoding/json alone would accept
// "livenessprobe" for "livenessProbe".
func decodeStrict(o *object) (any, error) {
	newT, ok := decoders[o.APIVersion+"/"+o.Kind]
	if _, elsewhere := checkedElsewhere[o.APIVersion+"/"+o.Kind]; !ok && elsewhere {
		return nil, nil // its checker (checkedElsewhere) validates it
	}
	if !ok {
		return nil, fmt.Errorf("no decoder for %s %s: add the kind to decoders so it is checked", o.APIVersion, o.Kind)
	}
	v := newT()
	data, err := yaml.YAMLToJSONStrict(o.YAML)
	if err != nil {
		return nil, err
	}
	strictErrs, err := kjson.UnmarshalStrict(data, v, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("decode into %T: %w", v, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("strict decode into %T: %v", v, errors.Join(strictErrs...))
	}
	return v, nil
}

func TestKustomizationsBuild(t *testing.T) {
	bs := builds(t)
	var dirs []string
	for _, b := range bs {
		dirs = append(dirs, b.Dir)
		t.Run(b.Dir, func(t *testing.T) {
			if b.Err != nil {
				t.Fatalf("kustomize build: %v", b.Err)
			}
			if len(b.Objects) == 0 {
				t.Fatal("the build emitted no objects")
			}
		})
	}
	for _, want := range requiredBuilds {
		if !slices.Contains(dirs, want) {
			t.Errorf("missing kustomization deploy/%s (found %v)", want, dirs)
		}
	}
}

// TestComponentsAreUsed: a component is built only through the overlays
// that include it, so each must be included by at least one.
func TestComponentsAreUsed(t *testing.T) {
	bs := builds(t)
	_, components, err := kustomizationDirs(deployRoot)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, b := range bs {
		k, err := readKustomization(filepath.Join(deployRoot, b.Dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range k.Components {
			used[filepath.ToSlash(filepath.Clean(filepath.Join(b.Dir, c)))] = true
		}
	}
	for _, c := range components {
		if !used[c] {
			t.Errorf("component deploy/%s is included by no kustomization, so nothing builds or checks it", c)
		}
	}
}

func TestObjectsDecodeStrictly(t *testing.T) {
	for _, b := range okBuilds(t) {
		t.Run(b.Dir, func(t *testing.T) {
			for _, o := range b.Objects {
				if o.DecodeErr != nil {
					t.Errorf("%s: %v", o, o.DecodeErr)
				}
			}
		})
	}
}

// TestStrictDecodingRejects proves the decoder used above can fail: a
// misspelt field, a field of the wrong type and a duplicate key are errors.
func TestStrictDecodingRejects(t *testing.T) {
	cases := []struct {
		name string
		yaml string
	}{
		{name: "unknown_field", yaml: "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 3\n"},
		{name: "wrong_type", yaml: "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: three\n"},
		{name: "duplicate_key", yaml: "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n  name: y\n"},
		{name: "unknown_container_field", yaml: "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          image: i:1\n          livenessprobe: {}\n"},
		{name: "unknown_kind", yaml: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\n"},
		{name: "strimzi_unknown_field", yaml: "apiVersion: kafka.strimzi.io/v1\nkind: KafkaTopic\nmetadata:\n  name: x\nspec:\n  partition: 3\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(tc.yaml), &head); err != nil {
				t.Fatal(err)
			}
			o := &object{APIVersion: head.APIVersion, Kind: head.Kind, YAML: []byte(tc.yaml)}
			if _, err := decodeStrict(o); err == nil {
				t.Errorf("decodeStrict accepted:\n%s", tc.yaml)
			}
		})
	}
}

// okBuilds returns the builds that kustomize built; TestKustomizationsBuild
// reports the others.
func okBuilds(t *testing.T) []*build {
	t.Helper()
	var out []*build
	for _, b := range builds(t) {
		if b.Err == nil {
			out = append(out, b)
		}
	}
	return out
}

// typed returns the objects of b that decoded into *T.
func typed[T any](b *build) []*T {
	var out []*T
	for _, o := range b.Objects {
		if v, ok := o.Typed.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

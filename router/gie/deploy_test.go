package gie_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// docs splits a YAML stream into its documents, dropping empty ones.
func docs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// gieModuleDir is where the Go toolchain keeps the GIE module.
func gieModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestInferencePoolMatchesTheCRD decodes the example InferencePool
// strictly into GIE's v1 type and validates it against the OpenAPI schema
// of the CRD GIE ships (config/crd/bases), the checks an API server makes
// before CEL rules.
func TestInferencePoolMatchesTheCRD(t *testing.T) {
	raw := readExample(t, "inferencepool.yaml")
	var pool v1.InferencePool
	if err := yaml.UnmarshalStrict(raw, &pool); err != nil {
		t.Fatalf("strict decode: %v", err)
	}
	crdRaw, err := os.ReadFile(filepath.Join(gieModuleDir(t), "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal(crdRaw, &crd); err != nil {
		t.Fatal(err)
	}
	var schema *apiextv1.JSONSchemaProps
	for _, v := range crd.Spec.Versions {
		if pool.APIVersion == crd.Spec.Group+"/"+v.Name && v.Schema != nil {
			schema = v.Schema.OpenAPIV3Schema
		}
	}
	if schema == nil || pool.Kind != crd.Spec.Names.Kind {
		t.Fatalf("%s %s is not served by the CRD", pool.APIVersion, pool.Kind)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(schema, &internal, nil); err != nil {
		t.Fatal(err)
	}
	validator, _, err := validation.NewSchemaValidator(&internal)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateCustomResource(field.NewPath(""), obj, validator); len(errs) > 0 {
		t.Fatalf("the InferencePool breaks the CRD's schema: %v", errs.ToAggregate())
	}
	// The schema check can fail: a pool without targetPorts is refused.
	delete(obj["spec"].(map[string]any), "targetPorts")
	if errs := validation.ValidateCustomResource(field.NewPath(""), obj, validator); len(errs) == 0 {
		t.Error("the schema accepted a pool without targetPorts")
	}
}

// TestDeployExample decodes every manifest strictly and checks that they
// name one another consistently: the pool's picker is the EPP Service,
// the Deployment runs under the RBAC's ServiceAccount and mounts the
// config the kustomization generates from epp-config-kvindex.yaml.
func TestDeployExample(t *testing.T) {
	var kust struct {
		APIVersion         string   `json:"apiVersion"`
		Kind               string   `json:"kind"`
		Resources          []string `json:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `json:"name"`
			Files []string `json:"files"`
		} `json:"configMapGenerator"`
		Images []struct {
			Name   string `json:"name"`
			NewTag string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.UnmarshalStrict(readExample(t, "kustomization.yaml"), &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if len(kust.ConfigMapGenerator) != 1 || len(kust.ConfigMapGenerator[0].Files) != 1 ||
		kust.ConfigMapGenerator[0].Files[0] != "epp-config.yaml=epp-config-kvindex.yaml" {
		t.Fatalf("the config map is not generated from epp-config-kvindex.yaml: %+v", kust.ConfigMapGenerator)
	}
	var (
		deploy  *appsv1.Deployment
		svc     *corev1.Service
		sa      *corev1.ServiceAccount
		roles   []rbacv1.Role
		binding []rbacv1.RoleBinding
		pool    v1.InferencePool
	)
	for _, res := range kust.Resources {
		for i, d := range docs(readExample(t, res)) {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(d, &meta); err != nil {
				t.Fatalf("%s #%d: %v", res, i, err)
			}
			var err error
			switch meta.Kind {
			case "Deployment":
				deploy = &appsv1.Deployment{}
				err = yaml.UnmarshalStrict(d, deploy)
			case "Service":
				svc = &corev1.Service{}
				err = yaml.UnmarshalStrict(d, svc)
			case "ServiceAccount":
				sa = &corev1.ServiceAccount{}
				err = yaml.UnmarshalStrict(d, sa)
			case "Role":
				var r rbacv1.Role
				err = yaml.UnmarshalStrict(d, &r)
				roles = append(roles, r)
			case "RoleBinding":
				var b rbacv1.RoleBinding
				err = yaml.UnmarshalStrict(d, &b)
				binding = append(binding, b)
			case "ClusterRole":
				err = yaml.UnmarshalStrict(d, &rbacv1.ClusterRole{})
			case "ClusterRoleBinding":
				err = yaml.UnmarshalStrict(d, &rbacv1.ClusterRoleBinding{})
			case "InferencePool":
				err = yaml.UnmarshalStrict(d, &pool)
			default:
				t.Fatalf("%s #%d: unexpected kind %q", res, i, meta.Kind)
			}
			if err != nil {
				t.Fatalf("%s #%d (%s): %v", res, i, meta.Kind, err)
			}
		}
	}
	if deploy == nil || svc == nil || sa == nil || len(roles) != 1 || len(binding) != 1 {
		t.Fatal("the example lacks a Deployment, Service, ServiceAccount, Role or RoleBinding")
	}
	if string(pool.Spec.EndpointPickerRef.Name) != svc.Name || pool.Spec.EndpointPickerRef.Port == nil ||
		int32(pool.Spec.EndpointPickerRef.Port.Number) != svc.Spec.Ports[0].Port {
		t.Errorf("the pool's endpointPickerRef %+v is not the EPP Service %s:%d", pool.Spec.EndpointPickerRef, svc.Name, svc.Spec.Ports[0].Port)
	}
	spec := deploy.Spec.Template.Spec
	if spec.ServiceAccountName != sa.Name || binding[0].Subjects[0].Name != sa.Name || binding[0].RoleRef.Name != roles[0].Name {
		t.Errorf("service account %q, binding %+v, role %q do not line up", spec.ServiceAccountName, binding[0], roles[0].Name)
	}
	c := spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--pool-name " + pool.Name, "--config-file /config/epp-config.yaml"} {
		if !strings.Contains(args, want) {
			t.Errorf("EPP args %q lack %q", args, want)
		}
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == kust.ConfigMapGenerator[0].Name
	}) {
		t.Errorf("no volume mounts the generated %q config map", kust.ConfigMapGenerator[0].Name)
	}
	if !strings.HasSuffix(c.Image, "kvindex-epp") {
		t.Errorf("the EPP runs image %q, not kvindex-epp", c.Image)
	}
	var podRule bool
	for _, r := range roles[0].Rules {
		podRule = podRule || (slices.Contains(r.Resources, "pods") && slices.Contains(r.Verbs, "watch"))
	}
	if !podRule {
		t.Error("the Role does not let the EPP watch pods")
	}
	if deploy.Spec.Selector == nil || deploy.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != svc.Spec.Selector["app.kubernetes.io/name"] {
		t.Error("the Service does not select the Deployment's pods")
	}
}

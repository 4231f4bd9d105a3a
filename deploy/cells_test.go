package deploy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvindex/kvindex/client/cellmap"
)

// TestCellsExample: each cell of examples/cells builds with its own
// namespace, topic and group (components/cell, from the cell's name), its
// workloads carry the cell label, and the router's cell map (parsed as
// the routers and bridges do) names exactly these cells with their
// topics and indexd Services, one model spread over two of them.
func TestCellsExample(t *testing.T) {
	byDir := map[string]*build{}
	for _, b := range builds(t) {
		byDir[b.Dir] = b
	}
	router := byDir["examples/cells/router"]
	if router == nil || router.Err != nil {
		t.Fatalf("examples/cells/router does not build: %v", router)
	}
	var doc string
	for _, cm := range typed[corev1.ConfigMap](router) {
		if cm.Name == "kvindex-cell-map" {
			doc = cm.Data["cells.json"]
		}
	}
	m, err := cellmap.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("the example's cell map: %v", err)
	}
	spread := 0
	for _, r := range m.File().Models {
		if len(r.Cells) > 1 {
			spread++
		}
	}
	if spread != 1 {
		t.Errorf("%d spread models in the example map, want 1", spread)
	}
	cells := m.Cells()
	if len(cells) != 3 {
		t.Fatalf("%d cells in the example map, want 3", len(cells))
	}
	for _, c := range cells {
		dir := filepath.ToSlash(filepath.Join("examples/cells", c.Name))
		b := byDir[dir]
		if b == nil || b.Err != nil {
			t.Fatalf("cell %s: deploy/%s does not build: %v", c.Name, dir, b)
		}
		ns := "kvindex-cell-" + c.Name
		var cfg *corev1.ConfigMap
		for _, cm := range typed[corev1.ConfigMap](b) {
			if strings.HasPrefix(cm.Name, "kvindex-config") {
				cfg = cm
			}
			if cm.Namespace != ns {
				t.Errorf("cell %s: ConfigMap %s in namespace %q, want %s", c.Name, cm.Name, cm.Namespace, ns)
			}
		}
		if cfg == nil {
			t.Fatalf("cell %s: no kvindex-config", c.Name)
		}
		if got := cfg.Data["kafka-topic"]; got != c.Topic {
			t.Errorf("cell %s: the ingesters read topic %q, the map sends bridges to %q", c.Name, got, c.Topic)
		}
		if got, want := cfg.Data["kafka-group"], "kvindex-ingester-"+c.Name; got != want {
			t.Errorf("cell %s: group %q, want %q", c.Name, got, want)
		}
		if want := fmt.Sprintf("dns:///kvindex-indexd.%s.svc:50051", ns); c.Indexd != want {
			t.Errorf("cell %s: the map's indexd %q, want the cell's Service %q", c.Name, c.Indexd, want)
		}
		svc := false
		for _, s := range typed[corev1.Service](b) {
			svc = svc || s.Name == "kvindex-indexd" && s.Namespace == ns
		}
		if !svc {
			t.Errorf("cell %s: no kvindex-indexd Service in %s", c.Name, ns)
		}
		for _, d := range typed[appsv1.Deployment](b) {
			if d.Labels["kvindex.io/cell"] != c.Name || d.Spec.Template.Labels["kvindex.io/cell"] != c.Name {
				t.Errorf("cell %s: Deployment %s lacks label kvindex.io/cell=%s", c.Name, d.Name, c.Name)
			}
		}
		for _, s := range typed[appsv1.StatefulSet](b) {
			if s.Labels["kvindex.io/cell"] != c.Name {
				t.Errorf("cell %s: StatefulSet %s lacks label kvindex.io/cell=%s", c.Name, s.Name, c.Name)
			}
		}
	}
}

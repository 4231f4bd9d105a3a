package gie_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	approx "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"

	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

// examples is deploy/examples/gie, read in place (not a copy).
var examples = filepath.Join("..", "..", "deploy", "examples", "gie")

func readExample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(examples, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExampleConfigLoads loads epp-config-kvindex.yaml with GIE's own
// loader, the way the runner does, many times: the kvindex producer is
// built from the registry and runs after the approximate producer the
// loader adds, in every load (the order is decided by data dependencies,
// not by map iteration).
func TestExampleConfigLoads(t *testing.T) {
	gie.Register()
	raw := readExample(t, "epp-config-kvindex.yaml")
	const loads = 30
	for i := range loads {
		_, handle, _, order, err := epptest.Load(t.Context(), raw, nil)
		if err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
		p, ok := handle.Plugin(gie.ProducerType).(*gie.Producer)
		if !ok {
			t.Fatalf("load %d: no %s plugin built (plugins: %v)", i, gie.ProducerType, handle.GetAllPluginsWithNames())
		}
		if p.TypedName().Type != gie.ProducerType {
			t.Fatalf("typed name %v", p.TypedName())
		}
		if handle.Plugin(approx.ApproxPrefixCachePluginType) == nil {
			t.Fatalf("load %d: the loader added no approximate producer", i)
		}
		ai := slices.Index(order, approx.ApproxPrefixCachePluginType+"/"+approx.ApproxPrefixCachePluginType)
		ki := slices.Index(order, gie.ProducerType+"/"+gie.ProducerType)
		if ai < 0 || ki < 0 || ai > ki {
			t.Fatalf("load %d: PrepareData order %v: the kvindex producer must run after the approximate one", i, order)
		}
	}
}

func TestApproxConfigLoads(t *testing.T) {
	gie.Register()
	_, handle, _, _, err := epptest.Load(t.Context(), readExample(t, "epp-config-approx.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if handle.Plugin(gie.ProducerType) != nil {
		t.Error("the approximate config builds a kvindex producer")
	}
	if handle.Plugin(approx.ApproxPrefixCachePluginType) == nil {
		t.Error("the approximate config has no approximate producer")
	}
}

// TestConfigsDifferByOneEntry: the kvindex config is the approximate one
// plus the producer's plugin entry, nothing removed or changed.
func TestConfigsDifferByOneEntry(t *testing.T) {
	decode := func(name string) *configapi.EndpointPickerConfig {
		cfg, _, err := loader.LoadRawConfig(readExample(t, name), logr.Discard())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return cfg
	}
	approxCfg, kv := decode("epp-config-approx.yaml"), decode("epp-config-kvindex.yaml")
	var added []configapi.PluginSpec
	kv.Plugins = slices.DeleteFunc(kv.Plugins, func(p configapi.PluginSpec) bool {
		if p.Type == gie.ProducerType {
			added = append(added, p)
			return true
		}
		return false
	})
	if len(added) != 1 {
		t.Fatalf("the kvindex config has %d %s entries, want 1", len(added), gie.ProducerType)
	}
	if diff := cmp.Diff(approxCfg, kv); diff != "" {
		t.Errorf("beyond the added entry, the configs differ (-approx +kvindex):\n%s", diff)
	}
	if _, err := gie.ParseProducerParams(added[0].Parameters); err != nil {
		t.Errorf("the example's parameters: %v", err)
	}
	if !strings.Contains(string(added[0].Parameters), "target") {
		t.Errorf("the example's parameters name no target: %s", added[0].Parameters)
	}
}

// Package epptest runs GIE v1.5.0's request path in process, with no
// Kubernetes API server: an EndpointPickerConfig loaded by GIE's own
// config loader (LoadRawConfig, InstantiateAndConfigure), plugins added
// and ordered as cmd/epp/runner/runner.go does, and a Director built as
// pkg/epp/requestcontrol/director_test.go builds one (a datastore fed
// through controller-runtime's fake client, NewDirectorWithConfig,
// HandleRequest). Tests of router/gie and router/gie/e2e use it; nothing
// kvindex-epp is built from imports it.
package epptest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/mocks"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/fairness"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/ordering"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/usagelimits"
	approx "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/profile"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/prefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/queuedepth"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
	poolutil "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/util/pool"
)

var registerOnce sync.Once

// RegisterInTree registers the in-tree plugin types a stock config and
// GIE's system defaults need (the runner does this in its unexported
// registerInTreePlugins): the scorers of the example configs, the prefix
// scorer and the approximate producer, a picker and a profile handler,
// the openai parser, the utilization detector, the flow-control defaults
// (fcfs, global-strict, static-usage-limit) and the metrics data source
// and extractor. Safe to call more than once.
func RegisterInTree() {
	registerOnce.Do(func() {
		fwkplugin.Register(queuedepth.QueueScorerType, queuedepth.QueueScorerFactory)
		fwkplugin.Register(kvcacheutilization.KvCacheUtilizationScorerType, kvcacheutilization.KvCacheUtilizationScorerFactory)
		fwkplugin.Register(prefix.PrefixCacheScorerPluginType, prefix.PrefixCachePluginFactory)
		fwkplugin.Register(approx.ApproxPrefixCachePluginType, approx.ApproxPrefixCacheFactory)
		fwkplugin.Register(picker.MaxScorePickerType, picker.MaxScorePickerFactory)
		fwkplugin.Register(picker.RandomPickerType, picker.RandomPickerFactory)
		fwkplugin.Register(profile.SingleProfileHandlerType, profile.SingleProfileHandlerFactory)
		fwkplugin.Register(openai.OpenAIParserType, openai.OpenAIParserPluginFactory)
		fwkplugin.Register(utilization.UtilizationDetectorType, utilization.UtilizationDetectorFactory)
		fwkplugin.Register(ordering.FCFSOrderingPolicyType, ordering.FCFSOrderingPolicyFactory)
		fwkplugin.Register(fairness.GlobalStrictFairnessPolicyType, fairness.GlobalStrictFairnessPolicyFactory)
		fwkplugin.Register(usagelimits.StaticUsageLimitPolicyType, usagelimits.StaticPolicyFactory)
		fwkplugin.Register(sourcemetrics.MetricsDataSourceType, sourcemetrics.MetricsDataSourceFactory)
		fwkplugin.Register(extractormetrics.MetricsExtractorType, extractormetrics.CoreMetricsExtractorFactory)
	})
}

// Load runs GIE's config loader on raw with a fresh handle bound to ctx
// (whose end stops the plugins' goroutines), then adds and orders the
// plugins as the runner does. It returns the loaded config, the handle,
// the request-control config and the PrepareData order.
func Load(ctx context.Context, raw []byte, podList fwkplugin.PodListFunc) (*config.Config, fwkplugin.Handle, *requestcontrol.Config, []string, error) {
	RegisterInTree()
	logger := logr.Discard()
	rawCfg, _, err := loader.LoadRawConfig(raw, logger)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if podList == nil {
		podList = func() []types.NamespacedName { return nil }
	}
	handle := fwkplugin.NewEppHandle(ctx, podList)
	cfg, err := loader.InstantiateAndConfigure(rawCfg, handle, logger)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	rc := requestcontrol.NewConfig()
	rc.AddPlugins(handle.GetAllPlugins()...)
	order, err := datalayer.ValidateAndOrderDataDependencies(handle.GetAllPlugins())
	if err != nil {
		return nil, nil, nil, nil, err
	}
	rc.OrderPrepareDataPlugins(order)
	return cfg, handle, rc, order, nil
}

// Pod is a model server pod of the pool.
type Pod struct {
	Name, IP string
}

// EPP is an endpoint picker in process.
type EPP struct {
	Director *requestcontrol.Director
	Handle   fwkplugin.Handle
	Config   *config.Config
	// Order is the PrepareData plugins' order ("type/name").
	Order []string
	ds    datastore.Datastore
	src   *mocks.MetricsDataSource
	seq   int
	mu    sync.Mutex
}

// Start loads raw and builds a director over pods, each serving
// targetPorts (GIE names the endpoint of the Nth port "<pod>-rank-N").
// The plugins live until t ends.
func Start(t testing.TB, raw []byte, pods []Pod, targetPorts []int) *EPP {
	t.Helper()
	e, err := New(t.Context(), raw, pods, targetPorts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// New is Start outside a test: the plugins and the datastore's
// goroutines live until ctx ends, which is how the caller stops them.
func New(ctx context.Context, raw []byte, pods []Pod, targetPorts []int) (*EPP, error) {
	// As datalayer.NewTestRuntime, with the logs discarded (it needs a
	// *testing.T; benchmarks have none).
	rt := datalayer.NewRuntime(time.Second)
	src := &mocks.MetricsDataSource{}
	if err := rt.Configure(&datalayer.Config{Sources: []datalayer.DataSourceConfig{{Plugin: src}}}, false, "", logr.Discard()); err != nil {
		return nil, fmt.Errorf("configuring the data layer: %w", err)
	}
	var epf datalayer.EndpointFactory = rt
	ds := datastore.NewDatastore(ctx, epf, 0)
	podList := func() []types.NamespacedName {
		var out []types.NamespacedName
		for _, ep := range ds.PodList(datastore.AllPodsPredicate) {
			out = append(out, ep.GetMetadata().NamespacedName)
		}
		return out
	}
	cfg, handle, rc, order, err := Load(ctx, raw, podList)
	if err != nil {
		return nil, fmt.Errorf("loading the EPP config: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	ports := make([]v1.Port, len(targetPorts))
	for i, p := range targetPorts {
		ports[i] = v1.Port{Number: v1.PortNumber(int32(p))}
	}
	pool := &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: "default"},
		Spec: v1.InferencePoolSpec{
			TargetPorts: ports,
			Selector:    v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "vllm"}},
		},
	}
	if err := ds.PoolSet(ctx, fake.NewClientBuilder().WithScheme(scheme).Build(), poolutil.InferencePoolToEndpointPool(pool)); err != nil {
		return nil, fmt.Errorf("setting the pool: %w", err)
	}
	for _, p := range pods {
		ds.PodUpdateOrAddIfNotExist(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: "default", Labels: map[string]string{"app": "vllm"}},
			Status: corev1.PodStatus{
				PodIP: p.IP, Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			},
		})
	}
	// No candidate cache: every request sees the datastore as it is.
	candidates := requestcontrol.NewDatastoreEndpointCandidates(ds)
	admission := requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, candidates)
	director := requestcontrol.NewDirectorWithConfig(ds, scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig),
		admission, handlers.NewParser(cfg.ParserConfig), candidates, rc)
	return &EPP{Director: director, Handle: handle, Config: cfg, Order: order, ds: ds, src: src}, nil
}

// SetMetrics makes every endpoint report m (a copy each), as a model
// server's metrics endpoint would: at once, and on every later poll of
// the data layer. Plugins read it from the endpoint (for example GIE's
// approximate producer sizes its ledger from CacheBlockSize and
// CacheNumBlocks when autoTune is on).
func (e *EPP) SetMetrics(m *fwkdl.Metrics) {
	e.setMetrics(func(*fwkdl.EndpointMetadata) (*fwkdl.Metrics, bool) { return m, true })
}

// SetEndpointMetrics makes each endpoint named in m, by its
// "address:port", report its own metrics (a copy), as SetMetrics does for
// all: at once and on every later poll. Endpoints m does not name keep
// what they reported. A caller that changes the metrics between requests
// (a simulated pod's queue) calls it before each Send.
func (e *EPP) SetEndpointMetrics(m map[string]*fwkdl.Metrics) {
	e.setMetrics(func(md *fwkdl.EndpointMetadata) (*fwkdl.Metrics, bool) {
		pm, ok := m[net.JoinHostPort(md.Address, md.Port)]
		return pm, ok
	})
}

// setMetrics gives each endpoint the metrics pick returns for it (a copy,
// now and to the data source's later polls); an endpoint pick has none
// for keeps what it reported.
func (e *EPP) setMetrics(pick func(*fwkdl.EndpointMetadata) (*fwkdl.Metrics, bool)) {
	all := map[types.NamespacedName]*fwkdl.Metrics{}
	for _, ep := range e.ds.PodList(datastore.AllPodsPredicate) {
		md := ep.GetMetadata()
		pm, ok := pick(md)
		if !ok {
			pm = ep.GetMetrics()
		}
		if pm == nil {
			continue
		}
		all[md.NamespacedName] = pm.Clone()
		if ok {
			ep.UpdateMetrics(pm.Clone())
		}
	}
	e.src.SetMetrics(all)
}

// Request is one request through the director.
type Request struct {
	Model string
	// Body is the JSON body; Path is ":path" ("/v1/completions" when
	// empty). RawBody, when set, is sent as the body instead of Body's
	// encoding (a caller that builds large bodies itself).
	Body    any
	RawBody []byte
	Path    string
	// Subset, when non-nil, is the Envoy subset hint
	// (x-gateway-destination-endpoint-subset) of "address:port" strings:
	// the candidate filter.
	Subset []string
}

// Completion is a /v1/completions request of prompt for model.
func Completion(model, prompt string) Request {
	return Request{Model: model, Body: map[string]any{"model": model, "prompt": prompt}}
}

// Send runs r through HandleRequest and returns the chosen endpoint
// ("address:port") and the request context.
func (e *EPP) Send(ctx context.Context, r Request) (string, *handlers.RequestContext, error) {
	e.mu.Lock()
	e.seq++
	id := "req-" + strconv.Itoa(e.seq)
	e.mu.Unlock()
	body := r.RawBody
	if body == nil {
		var err error
		if body, err = json.Marshal(r.Body); err != nil {
			return "", nil, err
		}
	}
	path := r.Path
	if path == "" {
		path = "/v1/completions"
	}
	reqCtx := &handlers.RequestContext{
		Request: &handlers.Request{
			Headers: map[string]string{reqcommon.RequestIdHeaderKey: id, ":path": path, "content-type": "application/json"},
			RawBody: body,
		},
		IncomingModelName: r.Model,
		TargetModelName:   r.Model,
		RequestSize:       len(body),
	}
	if r.Subset != nil {
		list := make([]any, len(r.Subset))
		for i, s := range r.Subset {
			list[i] = s
		}
		reqCtx.Request.Metadata = map[string]any{
			"envoy.lb.subset_hint": map[string]any{"x-gateway-destination-endpoint-subset": list},
		}
	}
	out, err := e.Director.HandleRequest(ctx, reqCtx)
	if err != nil {
		return "", out, fmt.Errorf("HandleRequest: %w", err)
	}
	return out.TargetEndpoint, out, nil
}

// Endpoints returns the datastore's endpoints' metadata.
func (e *EPP) Endpoints() []*fwkdl.EndpointMetadata {
	var out []*fwkdl.EndpointMetadata
	for _, ep := range e.ds.PodList(datastore.AllPodsPredicate) {
		out = append(out, ep.GetMetadata())
	}
	return out
}

package gie_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

// deadTarget returns a loopback address nothing listens on: a real
// kvindex client dialing it fails with UNAVAILABLE.
func deadTarget(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// newProducer builds a producer from raw JSON parameters through the
// factory, counting into m.
func newProducer(t *testing.T, m *gie.Metrics, params map[string]any) *gie.Producer {
	t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	p, err := gie.ProducerFactory(m)("kvindex", raw, plugin.NewEppHandle(t.Context(), nil))
	if err != nil {
		t.Fatal(err)
	}
	return p.(*gie.Producer)
}

func endpoints(n int) []framework.Endpoint {
	out := make([]framework.Endpoint, n)
	for i := range out {
		out[i] = framework.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("pod%d-rank-0", i)},
			PodName:        fmt.Sprintf("pod%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1), Port: "8000",
		}, nil, nil)
	}
	return out
}

func completion(model, prompt string) *framework.LLMRequest {
	return &framework.LLMRequest{
		RequestId: "r", TargetModel: model,
		Body: &framework.LLMRequestBody{Completions: &framework.CompletionsRequest{Prompt: framework.Prompt{Raw: prompt}}},
	}
}

func prefixInfo(t *testing.T, ep framework.Endpoint) (match, total, bs int, ok bool) {
	t.Helper()
	v, ok := ep.Get(attrprefix.PrefixCacheMatchInfoKey)
	if !ok {
		return 0, 0, 0, false
	}
	pi := v.(*attrprefix.PrefixCacheMatchInfo)
	return pi.MatchBlocks(), pi.TotalBlocks(), pi.BlockSizeTokens(), true
}

// words returns a prompt of n distinct words.
func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}

func TestFallbackKeepsOrZeroesTheAttribute(t *testing.T) {
	tok := epptest.StartTokenizer(t)
	for _, tc := range []struct {
		mode      string
		wantMatch int
	}{{gie.FallbackApproximate, 3}, {gie.FallbackNone, 0}} {
		t.Run(tc.mode, func(t *testing.T) {
			m := gie.NewMetrics()
			p := newProducer(t, m, map[string]any{"target": deadTarget(t), "fallback": tc.mode,
				"tokenizer": map[string]any{"url": tok.URL()}})
			eps := endpoints(3)
			for _, ep := range eps {
				// What the approximate producer would have left.
				ep.Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(3, 4, 16))
			}
			if err := p.PrepareRequestData(t.Context(), completion("m", words("w", 64)), eps); err != nil {
				t.Fatalf("PrepareRequestData returned %v; a fallback must not fail the plugin chain", err)
			}
			for _, ep := range eps {
				match, total, _, _ := prefixInfo(t, ep)
				if match != tc.wantMatch {
					t.Errorf("%s: match = %d (of %d), want %d", ep.GetMetadata().NamespacedName.Name, match, total, tc.wantMatch)
				}
				_, hasTier := ep.Get(gie.TierMatchKey)
				if hasTier != (tc.mode == gie.FallbackNone) {
					t.Errorf("tier attribute present = %v with fallback %s", hasTier, tc.mode)
				}
			}
			if got := fallbacks(t, m, tc.mode, gie.KindUnavailable); got != 1 {
				t.Errorf("fallbacks{%s,unavailable} = %v, want 1", tc.mode, got)
			}
		})
	}
}

// fallbacks returns the value of kvindex_gie_fallbacks_total{mode,reason}.
func fallbacks(t *testing.T, m *gie.Metrics, mode, reason string) float64 {
	t.Helper()
	return metricValue(t, m, "kvindex_gie_fallbacks_total", map[string]string{"mode": mode, "reason": reason})
}

// metricValue gathers m and returns the counter (or histogram count) of
// the series of name with labels (0 when absent).
func metricValue(t *testing.T, m *gie.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, mt := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range mt.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			if h := mt.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return mt.GetCounter().GetValue()
		}
	}
	return 0
}

func TestNothingWrittenAfterTheContextEnds(t *testing.T) {
	tok := epptest.StartTokenizer(t)
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": deadTarget(t), "fallback": gie.FallbackNone,
		"tokenizer": map[string]any{"url": tok.URL()}})
	eps := endpoints(2)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req := completion("m", words("w", 64))
	_ = p.PrepareRequestData(ctx, req, eps)
	for _, ep := range eps {
		if keys := ep.Keys(); len(keys) != 0 {
			t.Errorf("attributes %v written after the context ended", keys)
		}
	}
	if req.TokenizedPrompt != nil {
		t.Error("TokenizedPrompt written after the context ended")
	}
	if got := fallbacks(t, m, gie.FallbackNone, gie.KindDeadline); got != 1 {
		t.Errorf("fallbacks{none,deadline} = %v, want 1", got)
	}
}

func TestTokenizeTimeoutFallsBackInsideTheBudget(t *testing.T) {
	tok := epptest.StartTokenizer(t)
	tok.Delay.Store(int64(5 * time.Second))
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": deadTarget(t), "tokenizeTimeout": "50ms",
		"tokenizer": map[string]any{"url": tok.URL()}})
	start := time.Now()
	_ = p.PrepareRequestData(t.Context(), completion("m", "a b c"), endpoints(2))
	if d := time.Since(start); d >= gie.PrepareDataBudget {
		t.Errorf("PrepareRequestData took %v, not inside the director's %v budget", d, gie.PrepareDataBudget)
	}
	if got := fallbacks(t, m, gie.FallbackApproximate, gie.KindDeadline); got != 1 {
		t.Errorf("fallbacks{approximate,deadline} = %v, want 1", got)
	}
}

func TestTokensGivenSkipTheTokenizer(t *testing.T) {
	tok := epptest.StartTokenizer(t)
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": deadTarget(t), "tokenizer": map[string]any{"url": tok.URL()}})
	req := completion("m", "ignored")
	req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: make([]uint32, 64)}
	_ = p.PrepareRequestData(t.Context(), req, endpoints(2))
	if n := tok.Calls.Load(); n != 0 {
		t.Errorf("tokenizer called %d times with tokens given", n)
	}
	// Without tokens, it is called, on the configured URL, and the
	// tokens are left in the request.
	req = completion("m", "a b c")
	_ = p.PrepareRequestData(t.Context(), req, endpoints(2))
	if n := tok.Calls.Load(); n != 1 {
		t.Errorf("tokenizer called %d times, want 1", n)
	}
	if req.TokenizedPrompt == nil || cmp.Diff(epptest.Words("a b c"), req.TokenizedPrompt.TokenIDs) != "" {
		t.Errorf("TokenizedPrompt = %+v, want the tokenizer's ids", req.TokenizedPrompt)
	}
}

func TestUnsupportedAPIFallsBack(t *testing.T) {
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": deadTarget(t)})
	req := &framework.LLMRequest{TargetModel: "m", Body: &framework.LLMRequestBody{Embeddings: &framework.EmbeddingsRequest{Input: "x"}}}
	_ = p.PrepareRequestData(t.Context(), req, endpoints(1))
	if got := fallbacks(t, m, gie.FallbackApproximate, gie.KindNoPrompt); got != 1 {
		t.Errorf("fallbacks{approximate,no_prompt} = %v, want 1", got)
	}
}

func TestProducerDeclaresTheOrderingKeys(t *testing.T) {
	p := newProducer(t, nil, map[string]any{"target": deadTarget(t)})
	want := attrprefix.PrefixCacheMatchInfo{}
	if got := p.Produces()[attrprefix.PrefixCacheMatchInfoKey]; got != any(want) {
		t.Errorf("Produces()[PrefixCacheMatchInfoKey] = %#v, want the value PrefixCacheMatchInfo{}", got)
	}
	if got := p.Consumes()[attrprefix.PrefixCacheMatchInfoKey]; got != any(want) {
		t.Errorf("Consumes()[PrefixCacheMatchInfoKey] = %#v, want the value PrefixCacheMatchInfo{}", got)
	}
}

func TestTierScorer(t *testing.T) {
	eps := endpoints(5)
	eps[0].Put(gie.TierMatchKey, &gie.TierMatch{GPU: 4, Total: 4, BlockSize: 16})
	// The producer's TierMatch wins over the prefix attribute beside it.
	eps[0].Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(1, 4, 16))
	eps[1].Put(gie.TierMatchKey, &gie.TierMatch{CPU: 4, Total: 4, BlockSize: 16})
	eps[2].Put(gie.TierMatchKey, &gie.TierMatch{GPU: 1, Disk: 1, Total: 4, BlockSize: 16})
	// eps[3] has only the approximate producer's guess (a fallback);
	// eps[4] has nothing.
	eps[3].Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(3, 4, 16))
	for _, tc := range []struct {
		name   string
		params string
		want   []float64
	}{
		{"defaults", ``, []float64{1, 0.8, (1 + 0.5) / 4, 0.75, 0}},
		{"configured", `{"cpu":0.25,"disk":0}`, []float64{1, 0.25, 0.25, 0.75, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl, err := gie.TierScorerFactory("tiers", json.RawMessage(tc.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			s := pl.(*gie.TierScorer)
			if s.Category() != framework.Affinity {
				t.Errorf("category %v, want Affinity", s.Category())
			}
			scores := s.Score(t.Context(), nil, nil, eps)
			got := make([]float64, len(eps))
			for i, ep := range eps {
				got[i] = scores[ep]
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("scores (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMetricsRegister(t *testing.T) {
	m := gie.Register()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, m, map[string]any{"target": deadTarget(t)})
	_ = p.PrepareRequestData(t.Context(), completion("m", "a"), endpoints(1))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
	}
	want := []string{"kvindex_gie_fallbacks_total", "kvindex_gie_lookup_errors_total", "kvindex_gie_lookup_seconds",
		"kvindex_gie_lookups_total", "kvindex_gie_match_ratio", "kvindex_gie_prepare_seconds",
		"kvindex_gie_speculative_blocks_total", "kvindex_gie_tokenize_seconds"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("metric families (-want +got):\n%s", diff)
	}
	for _, typ := range []string{gie.ProducerType, gie.TierScorerType} {
		if _, ok := plugin.Registry[typ]; !ok {
			t.Errorf("%s not in the EPP's plugin registry", typ)
		}
	}
}

// TestIdentityErrorsCountRequests: endpoints that map to no pod identity
// count one lookup error per request (the metric counts requests, as for
// every kind), and the totals written for them, and on a fallback, count
// the prompt as looked up, cut at maxPromptTokens. Before, each such
// endpoint counted one, plus the fallback's, and the totals counted the
// whole prompt.
func TestIdentityErrorsCountRequests(t *testing.T) {
	noAddress := func(n int) []framework.Endpoint {
		eps := endpoints(n)
		for i := range eps {
			eps[i].GetMetadata().Address = ""
		}
		return eps
	}
	request := func() *framework.LLMRequest {
		req := completion("m", "ignored")
		req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: make([]uint32, 640)}
		return req
	}
	m := gie.NewMetrics()
	p := newProducer(t, m, map[string]any{"target": deadTarget(t), "maxPromptTokens": 32, "fallback": "none"})

	eps := noAddress(3) // none maps: the request falls back
	if err := p.PrepareRequestData(t.Context(), request(), eps); err != nil {
		t.Fatal(err)
	}
	if _, total, _, _ := prefixInfo(t, eps[0]); total != 2 {
		t.Errorf("fallback total = %d blocks, want 2 (maxPromptTokens 32, blocks of 16)", total)
	}
	identity := map[string]string{"kind": gie.KindIdentity}
	if got := metricValue(t, m, "kvindex_gie_lookup_errors_total", identity); got != 1 {
		t.Errorf("lookup_errors{identity} = %v after one request, want 1", got)
	}

	eps = append(noAddress(2), endpoints(1)...) // two do not map, one does
	if err := p.PrepareRequestData(t.Context(), request(), eps); err != nil {
		t.Fatal(err)
	}
	if _, total, _, _ := prefixInfo(t, eps[0]); total != 2 {
		t.Errorf("total of an endpoint without identity = %d blocks, want 2", total)
	}
	if got := metricValue(t, m, "kvindex_gie_lookup_errors_total", identity); got != 2 {
		t.Errorf("lookup_errors{identity} = %v after two requests, want 2", got)
	}
}

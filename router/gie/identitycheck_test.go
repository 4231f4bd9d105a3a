package gie

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

// listingIndex is an Index and EndpointLister over fixed per-model
// holders: every holder of a model matches every prompt's first blocks.
type listingIndex struct {
	byModel map[string][]Identity
	mu      sync.Mutex
	lists   int
}

func (f *listingIndex) LookupTokens(_ context.Context, model string, _ Prompt, candidates []Identity) (IndexAnswer, error) {
	var ans IndexAnswer
	for _, id := range f.byModel[model] {
		for _, c := range candidates {
			if c == id {
				ans.Matches = append(ans.Matches, IndexMatch{Identity: id, Blocks: 1, BlockSize: 16, Tiers: []Tier{TierGPU}})
			}
		}
	}
	return ans, nil
}

func (f *listingIndex) IndexedEndpoints(_ context.Context, model string, limit int) ([]Identity, error) {
	f.mu.Lock()
	f.lists++
	f.mu.Unlock()
	var out []Identity
	for m, ids := range f.byModel {
		if model == "" || m == model {
			out = append(out, ids...)
		}
	}
	return out[:min(len(out), limit)], nil
}

// capture is a logger keeping its lines.
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, args)
	}, funcr.Options{})
}

func (c *capture) matching(s string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

func podEndpoints(n int) []framework.Endpoint {
	out := make([]framework.Endpoint, n)
	for i := range out {
		out[i] = framework.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "models", Name: fmt.Sprintf("vllm-%d-rank-0", i)},
			PodName:        fmt.Sprintf("vllm-%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1), Port: "8000",
		}, nil, nil)
	}
	return out
}

func tokenRequest(model string) *framework.LLMRequest {
	return &framework.LLMRequest{RequestId: "r", TargetModel: model,
		TokenizedPrompt: &framework.TokenizedPrompt{TokenIDs: seq(64)}}
}

func TestIdentityMismatchCountedAndLogged(t *testing.T) {
	// The bridges publish pod names; the producer maps address:port.
	idx := &listingIndex{byModel: map[string][]Identity{"llama": {{Pod: "vllm-0"}, {Pod: "vllm-1"}}}}
	c := &clock{t: time.Unix(1000, 0)}
	p, err := NewProducer("", ProducerParams{Target: "x:1"}, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.check.now = c.now
	logs := &capture{}
	ctx := log.IntoContext(t.Context(), logs.logger())
	for range 3 {
		if err := p.PrepareRequestData(ctx, tokenRequest("llama"), podEndpoints(2)); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(p.metrics.mismatch.WithLabelValues("llama")); got != 1 {
		t.Errorf("mismatch{llama} = %v after 3 requests within one interval, want 1 (one check)", got)
	}
	warns := logs.matching("pod identity mismatch")
	if len(warns) != 1 {
		t.Fatalf("mismatch lines = %d, want 1: %q", len(warns), logs.lines)
	}
	for _, want := range []string{`"candidate"="10.0.0.1:8000 rank 0"`, `"indexed"="vllm-0 rank 0"`, `"podIdentity"="address-port"`, `"model"="llama"`} {
		if !strings.Contains(warns[0], want) {
			t.Errorf("mismatch line lacks %s: %s", want, warns[0])
		}
	}
	c.add(10 * time.Second)
	_ = p.PrepareRequestData(ctx, tokenRequest("llama"), podEndpoints(2))
	if got := testutil.ToFloat64(p.metrics.mismatch.WithLabelValues("llama")); got != 2 {
		t.Errorf("mismatch{llama} = %v after the interval, want 2", got)
	}

	// Configured to match the bridges: no mismatch, no listing on a hit.
	idx.lists = 0
	ok, err := NewProducer("", ProducerParams{Target: "x:1", PodIdentity: PodIdentityPodName}, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = ok.PrepareRequestData(ctx, tokenRequest("llama"), podEndpoints(2))
	if got := testutil.ToFloat64(ok.metrics.mismatch.WithLabelValues("llama")); got != 0 {
		t.Errorf("mismatch with the right podIdentity = %v", got)
	}
	if idx.lists != 0 {
		t.Errorf("listed endpoints %d times for a request the index answered", idx.lists)
	}
}

func TestColdPrefixIsNoMismatch(t *testing.T) {
	// vllm-0 is indexed and a candidate, but holds none of this prompt:
	// the Lookup matches nothing, and the check finds a candidate indexed.
	idx := &listingIndex{byModel: map[string][]Identity{"other": {{Pod: "vllm-0"}}}}
	p, err := NewProducer("", ProducerParams{Target: "x:1", PodIdentity: PodIdentityPodName,
		Models: []ModelMapping{{Match: "llama", Model: "other"}}}, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.matcher.index = emptyIndex{} // the Lookup matches nothing; the listing is idx's
	_ = p.PrepareRequestData(t.Context(), tokenRequest("llama"), podEndpoints(2))
	if got := testutil.ToFloat64(p.metrics.mismatch.WithLabelValues("other")); got != 0 {
		t.Errorf("mismatch for a cold prefix = %v, want 0", got)
	}
	if got := testutil.ToFloat64(p.metrics.unknown.WithLabelValues("other")); got != 0 {
		t.Errorf("unknown model for a known model = %v, want 0", got)
	}
}

// emptyIndex answers every Lookup with no match.
type emptyIndex struct{}

func (emptyIndex) LookupTokens(context.Context, string, Prompt, []Identity) (IndexAnswer, error) {
	return IndexAnswer{}, nil
}

func TestUnknownModelOrAdapterCounted(t *testing.T) {
	idx := &listingIndex{byModel: map[string][]Identity{"llama": {{Pod: "vllm-0"}}}}
	for _, tc := range []struct {
		name   string
		models []ModelMapping
		model  string
		want   float64
	}{
		// An adapter without a models entry is looked up under its own name.
		{"adapter_without_entry_no_models", nil, "sql-lora", 1},
		{"adapter_without_entry_base_configured", []ModelMapping{{Match: "llama"}}, "sql-lora", 1},
		{"base_configured_without_endpoints", []ModelMapping{{Match: "mistral"}}, "sql-lora", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProducer("", ProducerParams{Target: "x:1", PodIdentity: PodIdentityPodName, Models: tc.models}, idx, nil)
			if err != nil {
				t.Fatal(err)
			}
			logs := &capture{}
			ctx := log.IntoContext(t.Context(), logs.logger())
			_ = p.PrepareRequestData(ctx, tokenRequest(tc.model), podEndpoints(2))
			if got := testutil.ToFloat64(p.metrics.unknown.WithLabelValues(tc.model)); got != tc.want {
				t.Errorf("unknown_model{%s} = %v, want %v", tc.model, got, tc.want)
			}
			if got := testutil.ToFloat64(p.metrics.mismatch.WithLabelValues(tc.model)); got != 0 {
				t.Errorf("mismatch{%s} = %v, want 0", tc.model, got)
			}
			if n := len(logs.matching("unknown model")); float64(n) != tc.want {
				t.Errorf("unknown model lines = %d, want %v", n, tc.want)
			}
		})
	}
}

func TestIdentityCheckLabelsBounded(t *testing.T) {
	c := &identityCheck{labels: map[string]bool{}}
	for i := range maxModelLabels {
		if got := c.label(fmt.Sprint("m", i)); got != fmt.Sprint("m", i) {
			t.Fatalf("label %d = %q", i, got)
		}
	}
	if got := c.label("one-too-many"); got != "other" {
		t.Errorf("label past the bound = %q, want other", got)
	}
	if got := c.label("m0"); got != "m0" {
		t.Errorf("a known label = %q, want m0", got)
	}
}

// TestIdentityChecksBoundedAcrossModels: request models are caller input.
// A stream of new model names makes at most identityCheckBurst checks
// back to back, then maxModelLabels per interval, not a listing each.
func TestIdentityChecksBoundedAcrossModels(t *testing.T) {
	idx := &listingIndex{byModel: map[string][]Identity{}}
	c := &clock{t: time.Unix(1000, 0)}
	p, err := NewProducer("", ProducerParams{Target: "x:1", Models: []ModelMapping{{Match: "a"}, {Match: "b"}, {Match: "c"}}}, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.check.now = c.now
	lists := func() int {
		idx.mu.Lock()
		defer idx.mu.Unlock()
		return idx.lists
	}
	send := func(from, n int) {
		for i := range n {
			if err := p.PrepareRequestData(t.Context(), tokenRequest(fmt.Sprint("rand-", from+i)), podEndpoints(2)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each check of an unknown model lists the model, then each of the 3
	// base models (none holds an endpoint): 4 listings.
	send(0, 100)
	if got, want := lists(), identityCheckBurst*4; got != want {
		t.Fatalf("100 new models at once: %d listings, want %d", got, want)
	}
	c.add(time.Duration(*p.params.IdentityCheckInterval))
	send(100, 100)
	if got, want := lists(), 2*identityCheckBurst*4; got != want {
		t.Fatalf("an interval later, 100 more: %d listings in all, want %d", got, want)
	}
}

// deadlineLister fails every listing, recording its context's deadline.
type deadlineLister struct {
	listingIndex
	deadlines []time.Time
}

func (d *deadlineLister) IndexedEndpoints(ctx context.Context, _ string, _ int) ([]Identity, error) {
	dl, _ := ctx.Deadline()
	d.mu.Lock()
	d.deadlines = append(d.deadlines, dl)
	d.mu.Unlock()
	return []Identity{}, nil
}

// TestIdentityCheckWithinBudget: a check's listings (the model's, then
// each base model's) share one deadline, the lookup timeout from the
// check's start, so the request waits at most that long for them.
func TestIdentityCheckWithinBudget(t *testing.T) {
	idx := &deadlineLister{listingIndex: listingIndex{byModel: map[string][]Identity{}}}
	models := []ModelMapping{{Match: "a"}, {Match: "b"}, {Match: "c"}}
	p, err := NewProducer("", ProducerParams{Target: "x:1", Models: models}, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.PrepareRequestData(t.Context(), tokenRequest("cold"), podEndpoints(2)); err != nil {
		t.Fatal(err)
	}
	if len(idx.deadlines) != 1+len(models) {
		t.Fatalf("%d listings, want %d", len(idx.deadlines), 1+len(models))
	}
	budget := time.Duration(p.params.LookupTimeout)
	for i, dl := range idx.deadlines {
		if dl != idx.deadlines[0] || dl.IsZero() || dl.After(time.Now().Add(budget)) || dl.Before(start) {
			t.Errorf("listing %d: deadline %v, want the one deadline within %v of the check's start %v", i, dl, budget, start)
		}
	}
}

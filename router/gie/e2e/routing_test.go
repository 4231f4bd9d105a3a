package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"
	approx "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
	"github.com/kvindex/kvindex/wiring/stack"
)

// holdings stores, for three prompts, a different longest holder, each
// pod's engine hashing differently: p0 on pod 1 (1 block on pod 0),
// p1 on pod 2, p2 on pod 0 (2 blocks on pod 1). It returns the prompts'
// texts and the index of their holder.
func holdings(t *testing.T, f *fleet) ([]string, []int) {
	t.Helper()
	t0, p0 := prompt("alpha", 64)
	t1, p1 := prompt("beta", 64)
	t2, p2 := prompt("gamma", 64)
	f.store(podID(0), 0, p0, 1, "GPU")
	f.store(podID(1), 0, p0, 4, "GPU")
	f.store(podID(2), 0, p1, 3, "GPU")
	f.store(podID(0), 0, p2, 4, "GPU")
	f.store(podID(1), 0, p2, 2, "GPU")
	f.waitMatch(p0, podID(1), 0, 4)
	f.waitMatch(p1, podID(2), 0, 3)
	f.waitMatch(p2, podID(0), 0, 4)
	f.waitMatch(p2, podID(1), 0, 2)
	f.waitMatch(p0, podID(0), 0, 1)
	return []string{t0, t1, t2}, []int{1, 2, 0}
}

func send(t *testing.T, e *epptest.EPP, r epptest.Request) string {
	t.Helper()
	got, _, err := e.Send(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestLongestPrefixAcrossRestarts: each request goes to the pod holding
// its longest prefix, through GIE's director, and still does after the
// router restarts (new plugin instances, no state carried over). The
// approximate config, restarted the same way, knows nothing: its
// producer's attribute is zero for every pod.
func TestLongestPrefixAcrossRestarts(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	texts, holders := holdings(t, f)
	cfg := eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false)
	for restart := range 3 {
		m := gie.Register()
		e := epptest.Start(t, cfg, pods, []int{8000})
		for i, text := range texts {
			if got, want := send(t, e, epptest.Completion(model, text)), podID(holders[i]); got != want {
				t.Errorf("restart %d, prompt %d: routed to %s, want its longest holder %s", restart, i, got, want)
			}
		}
		if n := metricValue(t, m, "kvindex_gie_fallbacks_total", nil); n != 0 {
			t.Errorf("restart %d: %v fallbacks with kvindex up", restart, n)
		}
	}
	// The approximate config after a restart: its producer has no ledger.
	raw, err := osReadExample("epp-config-approx.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := epptest.Start(t, raw, pods, []int{8000})
	ap := e.Handle.Plugin(approx.ApproxPrefixCachePluginType).(requestcontrol.PrepareDataPlugin)
	for i, text := range texts {
		eps := candidates(e)
		if err := ap.PrepareRequestData(t.Context(), tokenized(text), eps); err != nil {
			t.Fatal(err)
		}
		for _, ep := range eps {
			if m := matchOf(t, ep); m != 0 {
				t.Errorf("prompt %d: the restarted approximate producer claims %d blocks on %s", i, m, ep.GetMetadata().Address)
			}
		}
	}
}

// TestKVIndexAnswerWinsInEveryLoad: the approximate producer's ledger is
// made to point at pod 0 (the request went there through the candidate
// filter), while kvindex says pod 1 holds the prefix; in every load of the
// config the request goes to pod 1, so the kvindex producer ran after the
// approximate one and its attribute is the one scored.
func TestKVIndexAnswerWinsInEveryLoad(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	texts, _ := holdings(t, f)
	cfg := eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false)
	for load := range 10 {
		gie.Register()
		e := epptest.Start(t, cfg, pods, []int{8000})
		r := epptest.Completion(model, texts[0])
		r.Subset = []string{podID(0)}
		if got := send(t, e, r); got != podID(0) {
			t.Fatalf("load %d: the candidate filter sent the request to %s, want %s", load, got, podID(0))
		}
		// Let the approximate producer's asynchronous ledger update land.
		time.Sleep(50 * time.Millisecond)
		if got := send(t, e, epptest.Completion(model, texts[0])); got != podID(1) {
			t.Errorf("load %d (order %v): routed to %s, want kvindex's holder %s over the approximate ledger's %s",
				load, e.Order, got, podID(1), podID(0))
		}
	}
}

// TestCandidateFilter: the EPP's candidates are the Lookup's filter; the
// best holder among them wins even when a better one is filtered out.
func TestCandidateFilter(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	texts, _ := holdings(t, f)
	gie.Register()
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false), pods, []int{8000})
	// p2: pod 0 holds 4 blocks, pod 1 holds 2; without pod 0, pod 1 wins.
	r := epptest.Completion(model, texts[2])
	r.Subset = []string{podID(1), podID(2)}
	if got := send(t, e, r); got != podID(1) {
		t.Errorf("routed to %s, want %s (the best holder among the candidates)", got, podID(1))
	}
}

// TestTierScorerPrefersGPU: two pods hold the same prefix, one on GPU,
// one offloaded to CPU; the prefix scorer ties them and the tier scorer
// picks the GPU holder.
func TestTierScorerPrefersGPU(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	text, p := prompt("delta", 64)
	f.store(podID(0), 0, p, 4, "CPU")
	f.store(podID(2), 0, p, 4, "GPU")
	f.waitMatch(p, podID(0), 0, 4)
	f.waitMatch(p, podID(2), 0, 4)
	gie.Register()
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, true), pods, []int{8000})
	for i := range 5 {
		if got := send(t, e, epptest.Completion(model, text)); got != podID(2) {
			t.Errorf("request %d: routed to %s, want the GPU holder %s", i, got, podID(2))
		}
	}
}

// TestSpeculativeEntries: back-to-back requests with new prefixes (no
// event published) land on one pod, from the producer's speculative
// entries; with the entries off they need not.
func TestSpeculativeEntries(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	m := gie.Register()
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), nil, false), pods, []int{8000})
	for i := range 5 {
		text, _ := prompt("new"+string(rune('a'+i)), 64)
		first := send(t, e, epptest.Completion(model, text))
		if second := send(t, e, epptest.Completion(model, text)); second != first {
			t.Errorf("pair %d: %s then %s, want one pod", i, first, second)
		}
	}
	if got := metricValue(t, m, "kvindex_gie_speculative_blocks_total", nil); got != 5*4 {
		t.Errorf("speculative blocks credited = %v, want 20 (4 blocks per second request)", got)
	}
}

// TestDataParallelRanks: pods serve two ranks (target ports 8000, 8001);
// rank 1 of pod 1 holds the prefix and its bridge names it
// $(POD_IP):8000, rank 1: the request goes to port 8001 of pod 1.
func TestDataParallelRanks(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	text, p := prompt("epsilon", 64)
	f.store(podID(1), 1, p, 4, "GPU")
	f.store(podID(1), 0, p, 1, "GPU")
	f.waitMatch(p, podID(1), 1, 4)
	gie.Register()
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false), pods, []int{8000, 8001})
	var names []string
	for _, md := range e.Endpoints() {
		if md.PodName == pods[1].Name {
			names = append(names, md.NamespacedName.Name+"@"+md.Port)
		}
	}
	if diff := cmp.Diff([]string{"vllm-b-rank-0@8000", "vllm-b-rank-1@8001"}, sorted(names)); diff != "" {
		t.Fatalf("GIE's endpoints of a two-port pod (-want +got):\n%s", diff)
	}
	if got, want := send(t, e, epptest.Completion(model, text)), pods[1].IP+":8001"; got != want {
		t.Errorf("routed to %s, want rank 1's port %s", got, want)
	}
}

// TestLoRA: the model mapping sends a LoRA model's requests to the holder
// of the adapter's blocks, and the base model's to the base holder.
func TestLoRA(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	text, p := prompt("zeta", 64)
	lp := p
	lp.LoRAName = "sql"
	f.store(podID(0), 0, lp, 4, "GPU")
	f.store(podID(2), 0, p, 4, "GPU")
	f.waitMatch(lp, podID(0), 0, 4)
	f.waitMatch(p, podID(2), 0, 4)
	gie.Register()
	extra := []string{`speculativeTTL: "0s"`, "models:", "  - match: sql-lora", "    model: " + model, "    lora: sql"}
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), extra, false), pods, []int{8000})
	if got := send(t, e, epptest.Completion("sql-lora", text)); got != podID(0) {
		t.Errorf("LoRA request routed to %s, want the adapter's holder %s", got, podID(0))
	}
	if got := send(t, e, epptest.Completion(model, text)); got != podID(2) {
		t.Errorf("base request routed to %s, want the base holder %s", got, podID(2))
	}
}

// TestMultimodal: TokenizedPrompt's multimodal features become the
// Lookup's extras: two pods hold the same tokens with different images;
// each image's request matches its own holder past the image.
func TestMultimodal(t *testing.T) {
	f := startFleet(t, nil)
	tok := epptest.StartTokenizer(t)
	_, p := prompt("eta", 64)
	withImage := func(h string) client.TokenPrompt {
		q := p
		q.MultiModal = []client.MultiModalItem{{Hash: h, Offset: 20, Length: 8}}
		return q
	}
	f.store(podID(0), 0, withImage("img-a"), 4, "GPU")
	f.store(podID(1), 0, withImage("img-b"), 4, "GPU")
	f.waitMatch(withImage("img-a"), podID(0), 0, 4)
	f.waitMatch(withImage("img-b"), podID(1), 0, 4)
	gie.Register()
	e := epptest.Start(t, eppConfig(t, f.st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false), pods, []int{8000})
	prod := e.Handle.Plugin(gie.ProducerType).(*gie.Producer)
	for _, tc := range []struct {
		image string
		want  map[string]int
	}{
		// Block 0 has no image, so both hold it; the image sits in block 1.
		{"img-a", map[string]int{pods[0].IP: 4, pods[1].IP: 1, pods[2].IP: 0}},
		{"img-b", map[string]int{pods[0].IP: 1, pods[1].IP: 4, pods[2].IP: 0}},
	} {
		req := &framework.LLMRequest{RequestId: "mm", TargetModel: model,
			Body: &framework.LLMRequestBody{Completions: &framework.CompletionsRequest{}},
			TokenizedPrompt: &framework.TokenizedPrompt{TokenIDs: p.TokenIDs, MultiModalFeatures: []framework.MultiModalFeature{
				{Modality: framework.ModalityImage, Hash: tc.image, Offset: 20, Length: 8}}}}
		eps := candidates(e)
		if err := prod.PrepareRequestData(t.Context(), req, eps); err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, ep := range eps {
			got[ep.GetMetadata().Address] = matchOf(t, ep)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: matched blocks (-want +got):\n%s", tc.image, diff)
		}
	}
}

// TestKVIndexStoppedMidRun: the stack stops; requests keep being
// scheduled (through the approximate producer's attribute) and every one
// is counted as a fallback.
func TestKVIndexStoppedMidRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := stack.Start(ctx, stack.Config{DataDir: t.TempDir(), EtcdAddr: "127.0.0.1:0", KafkaAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", UnsafeNoFsync: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- st.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("stack: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	f := startFleet(t, st)
	tok := epptest.StartTokenizer(t)
	text, p := prompt("theta", 64)
	f.store(podID(2), 0, p, 4, "GPU")
	f.waitMatch(p, podID(2), 0, 4)
	m := gie.Register()
	e := epptest.Start(t, eppConfig(t, st.GRPCAddr(), tok.URL(), []string{`speculativeTTL: "0s"`}, false), pods, []int{8000})
	if got := send(t, e, epptest.Completion(model, text)); got != podID(2) {
		t.Fatalf("with kvindex up: routed to %s, want %s", got, podID(2))
	}
	stop()
	const n = 10
	for i := range n {
		text, _ := prompt("after"+string(rune('a'+i)), 64)
		start := time.Now()
		if _, _, err := e.Send(t.Context(), epptest.Completion(model, text)); err != nil {
			t.Fatalf("request %d after kvindex stopped was not scheduled: %v", i, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("request %d took %v", i, d)
		}
	}
	if got := metricValue(t, m, "kvindex_gie_fallbacks_total", map[string]string{"mode": gie.FallbackApproximate}); got != n {
		t.Errorf("fallbacks = %v, want %d (one per request after the stop)", got, n)
	}
}

// helpers

// candidates returns fresh scheduling endpoints of the EPP's datastore.
func candidates(e *epptest.EPP) []framework.Endpoint {
	var out []framework.Endpoint
	for _, md := range e.Endpoints() {
		out = append(out, framework.NewEndpoint(md, fwkdl.NewMetrics(), nil))
	}
	return out
}

func tokenized(text string) *framework.LLMRequest {
	return &framework.LLMRequest{RequestId: "approx", TargetModel: model,
		Body: &framework.LLMRequestBody{Completions: &framework.CompletionsRequest{Prompt: framework.Prompt{Raw: text}}}}
}

func matchOf(t *testing.T, ep framework.Endpoint) int {
	t.Helper()
	v, ok := ep.Get(attrprefix.PrefixCacheMatchInfoKey)
	if !ok {
		t.Fatalf("%s has no PrefixCacheMatchInfo", ep.GetMetadata().NamespacedName)
	}
	return v.(*attrprefix.PrefixCacheMatchInfo).MatchBlocks()
}

func sorted(s []string) []string {
	return slices.Sorted(slices.Values(s))
}

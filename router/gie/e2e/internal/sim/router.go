package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

// The strategies.
const (
	// StrategyRandom is GIE's random picker with no scorer.
	StrategyRandom = "random"
	// StrategyApprox is GIE's stock prefix-aware config
	// (deploy/examples/gie/epp-config-approx.yaml): the approximate
	// producer's ledger.
	StrategyApprox = "approx"
	// StrategyKVIndex is the same config plus kvindex's producer
	// (epp-config-kvindex.yaml).
	StrategyKVIndex = "kvindex"
	// StrategyKVIndexTier adds kvindex's tier scorer to the kvindex
	// config.
	StrategyKVIndexTier = "kvindex-tier"
	// StrategyOracle routes by the pods' true cache contents, with no lag.
	StrategyOracle = "oracle"
)

// Strategies lists every strategy, in report order.
var Strategies = []string{StrategyRandom, StrategyApprox, StrategyKVIndex, StrategyKVIndexTier, StrategyOracle}

// usesEPP reports whether the strategy routes through GIE's director.
func usesEPP(s string) bool { return s != StrategyOracle }

// stateless reports whether the strategy keeps no state, so its result
// does not depend on the number of router instances or their restarts.
func stateless(s string) bool { return s == StrategyRandom || s == StrategyOracle }

// The route recorder: a PreRequest plugin added to every config the
// simulator loads. It writes the match the scheduler saw on the chosen
// endpoint into the request's headers, so the simulator can tell a ghost
// route (the router expected a hit the pod no longer had).
const (
	recorderType = "kvindex-sim-route-recorder"
	beliefHeader = "x-kvindex-sim-believed-blocks"
)

type recorder struct{ name fwkplugin.TypedName }

func (r *recorder) TypedName() fwkplugin.TypedName { return r.name }

func (r *recorder) PreRequest(_ context.Context, req *framework.LLMRequest, res *framework.SchedulingResult) {
	if req == nil || req.Headers == nil || res == nil {
		return
	}
	primary := res.ProfileResults[res.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return
	}
	if v, ok := primary.TargetEndpoints[0].Get(attrprefix.PrefixCacheMatchInfoKey); ok {
		if m, ok := v.(*attrprefix.PrefixCacheMatchInfo); ok {
			req.Headers[beliefHeader] = strconv.Itoa(m.MatchBlocks())
		}
	}
}

// tokensType is the simulator's stand-in for an upstream tokenizer
// plugin: a PrepareData plugin that fills the request's TokenizedPrompt
// from its prompt text (ParsePrompt), so the request carries its token ids
// as well as its Completions prompt. GIE v1.5.0 orders PrepareData plugins
// only by the data keys they produce and consume, and the kvindex
// producer consumes only PrefixCacheMatchInfoKey; declaring that key in
// Produces is the one way to run before it. The plugin writes no such
// attribute. Should it ever run after the producer, the producer
// tokenizes through the simulator's Tokenizer instead (counted in
// Result.TokenizeCalls).
const tokensType = "kvindex-sim-tokenized-prompt"

type tokensPlugin struct{ name fwkplugin.TypedName }

func (t *tokensPlugin) TypedName() fwkplugin.TypedName { return t.name }

func (t *tokensPlugin) Produces() map[string]any {
	return map[string]any{attrprefix.PrefixCacheMatchInfoKey: attrprefix.PrefixCacheMatchInfo{}}
}

func (t *tokensPlugin) Consumes() map[string]any { return map[string]any{} }

func (t *tokensPlugin) PrepareRequestData(_ context.Context, req *framework.LLMRequest, _ []framework.Endpoint) error {
	if req == nil || req.Body == nil || req.Body.Completions == nil || req.TokenizedPrompt != nil {
		return nil
	}
	ids, err := ParsePrompt(req.Body.Completions.Prompt.PlainText())
	if err != nil {
		return nil // not a simulator prompt: leave it to the tokenizer
	}
	req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: ids}
	return nil
}

var registerOnce sync.Once

func registerPlugins() {
	registerOnce.Do(func() {
		fwkplugin.Register(recorderType, func(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
			return &recorder{name: fwkplugin.TypedName{Type: recorderType, Name: name}}, nil
		})
		fwkplugin.Register(tokensType, func(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
			return &tokensPlugin{name: fwkplugin.TypedName{Type: tokensType, Name: name}}, nil
		})
	})
}

// The kvindex example config's target line, replaced by the stack's.
const exampleTarget = "target: dns:///kvindex-indexd.kvindex.svc.cluster.local:50051"

// prefixRef is the profile line of the prefix scorer in the example
// configs.
const prefixRef = "      - pluginRef: prefix-cache-scorer\n"

// randomConfig is the random baseline: GIE's random picker, no scorer.
const randomConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: random-picker
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: random-picker
`

// Configs builds each EPP strategy's EndpointPickerConfig from the
// example configs in dir (deploy/examples/gie), pointing the kvindex
// producer at indexd (target) and at the tokenizer, with its block size
// set to the trace's and maxPromptTokens to maxTokens, so that no prompt
// is looked up by a truncated prefix. Every config gets the route
// recorder; the kvindex ones get the tokenized-prompt plugin.
func Configs(dir, target, tokenizerURL string, maxTokens int) (map[string][]byte, error) {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("reading the example config: %w", err)
		}
		return string(b), nil
	}
	approx, err := read("epp-config-approx.yaml")
	if err != nil {
		return nil, err
	}
	kv, err := read("epp-config-kvindex.yaml")
	if err != nil {
		return nil, err
	}
	if !strings.Contains(kv, exampleTarget) || !strings.Contains(kv, "      fallback: approximate\n") {
		return nil, fmt.Errorf("%s: epp-config-kvindex.yaml no longer has the target and fallback lines the simulator replaces", dir)
	}
	kv = strings.Replace(kv, exampleTarget, "target: "+target, 1)
	kv = strings.Replace(kv, "      fallback: approximate\n", "      fallback: approximate\n"+
		"      blockSize: "+strconv.Itoa(BlockTokens)+"\n"+
		"      maxPromptTokens: "+strconv.Itoa(maxTokens)+"\n"+
		"      tokenizer:\n        url: "+tokenizerURL+"\n", 1)
	// kvindex-tier: the tier scorer takes the prefix scorer's place in
	// the profile, at its weight, so affinity weighs against load as in
	// kvindex and only the tiers reorder holders (added on top, it raised
	// affinity's share of the score against the load scorers, and counted
	// every matched block twice: docs/router.md).
	if !strings.Contains(kv, prefixRef) {
		return nil, fmt.Errorf("%s: epp-config-kvindex.yaml no longer references prefix-cache-scorer in its profile", dir)
	}
	tier := strings.Replace(kv, "schedulingProfiles:", "  - type: kvindex-tier-scorer\nschedulingProfiles:", 1)
	tier = strings.Replace(tier, prefixRef, "      - pluginRef: kvindex-tier-scorer\n", 1)
	out := map[string][]byte{}
	for s, raw := range map[string]string{StrategyRandom: randomConfig, StrategyApprox: approx, StrategyKVIndex: kv, StrategyKVIndexTier: tier} {
		if !strings.Contains(raw, "\nschedulingProfiles:") {
			return nil, fmt.Errorf("the %s config has no schedulingProfiles section", s)
		}
		add := "\n  - type: " + recorderType
		if s == StrategyKVIndex || s == StrategyKVIndexTier {
			add += "\n  - type: " + tokensType
		}
		out[s] = []byte(strings.Replace(raw, "\nschedulingProfiles:", add+"\nschedulingProfiles:", 1))
	}
	return out, nil
}

// instance is one router replica: an EPP and the requests it has taken
// since it started.
type instance struct {
	epp       *epptest.EPP
	cancel    context.CancelFunc
	served    int
	restartAt int
}

// routers is K router instances of one strategy behind a round-robin
// load balancer. With restartEvery > 0 each instance is replaced by a
// fresh one (new plugin instances, empty ledgers) after it has taken
// restartEvery requests; instance i first restarts after
// restartEvery*(i+1)/K requests, so replicas restart at staggered times.
// Owned by one run's goroutine; close stops every instance.
type routers struct {
	ctx          context.Context
	raw          []byte
	pods         []epptest.Pod
	metrics      *fwkdl.Metrics
	inst         []*instance
	next         int
	restartEvery int
	restarts     int
}

func newRouters(ctx context.Context, raw []byte, pods []epptest.Pod, metrics *fwkdl.Metrics, k, restartEvery int) (*routers, error) {
	r := &routers{ctx: ctx, raw: raw, pods: pods, metrics: metrics, restartEvery: restartEvery}
	for i := range k {
		in, err := r.start()
		if err != nil {
			r.close()
			return nil, err
		}
		if restartEvery > 0 {
			in.restartAt = max(1, restartEvery*(i+1)/k)
		}
		r.inst = append(r.inst, in)
	}
	return r, nil
}

func (r *routers) start() (*instance, error) {
	ctx, cancel := context.WithCancel(r.ctx)
	e, err := epptest.New(ctx, r.raw, r.pods, []int{podPort})
	if err != nil {
		cancel()
		return nil, err
	}
	e.SetMetrics(r.metrics)
	return &instance{epp: e, cancel: cancel}, nil
}

// route sends one request through the next instance (restarting it first
// when its time has come), with the pods reporting podMetrics (by
// address:port) to it, and returns the chosen endpoint (address:port) and
// the match blocks the scheduler saw on it.
func (r *routers) route(ctx context.Context, req epptest.Request, podMetrics map[string]*fwkdl.Metrics) (string, int, error) {
	i := r.next
	r.next = (r.next + 1) % len(r.inst)
	in := r.inst[i]
	if in.restartAt > 0 && in.served >= in.restartAt {
		fresh, err := r.start()
		if err != nil {
			return "", 0, fmt.Errorf("restarting router %d: %w", i, err)
		}
		in.cancel()
		fresh.restartAt = r.restartEvery
		r.inst[i], in = fresh, fresh
		r.restarts++
	}
	in.served++
	in.epp.SetEndpointMetrics(podMetrics)
	ep, rc, err := in.epp.Send(ctx, req)
	if err != nil {
		return "", 0, err
	}
	believed := 0
	if rc != nil && rc.Request != nil {
		if v, ok := rc.Request.Headers[beliefHeader]; ok {
			believed, _ = strconv.Atoi(v)
		}
	}
	return ep, believed, nil
}

func (r *routers) close() {
	for _, in := range r.inst {
		in.cancel()
	}
}

// podMatch is one pod's prefix of a request in the pod's true state (Pod.Match):
// its leading blocks on GPU and, after them, only on the CPU tier; ok is
// false for a pod the load cap excluded.
type podMatch struct {
	gpu, cpu int
	ok       bool
}

// value is the match's hit value: GPU blocks count 1, CPU-tier ones
// CPUHitWeight.
func (m podMatch) value() float64 { return float64(m.gpu) + CPUHitWeight*float64(m.cpu) }

// matchPods matches keys against every allowed pod, once per request for
// both the oracle and tierHeadroom.
func matchPods(pods []*Pod, allowed []bool, keys []uint64) []podMatch {
	out := make([]podMatch, len(pods))
	for i, p := range pods {
		if allowed[i] {
			out[i].gpu, out[i].cpu = p.Match(keys)
			out[i].ok = true
		}
	}
	return out
}

// oracle routes to the allowed pod with the most cached prefix value
// (podMatch.value); ties go to a random one of the tied pods (as GIE's
// max-score picker breaks ties). It returns the pod's index and the
// blocks it holds.
func oracle(matches []podMatch, rng *rand.Rand) (int, int) {
	best, bestN, held := -1.0, 0, 0
	pick := -1
	for i, m := range matches {
		if !m.ok {
			continue
		}
		switch v := m.value(); {
		case v > best:
			best, bestN, pick, held = v, 1, i, m.gpu+m.cpu
		case v == best:
			bestN++
			if rng.IntN(bestN) == 0 {
				pick, held = i, m.gpu+m.cpu
			}
		}
	}
	return pick, held
}

// tierHeadroom is, in blocks of hit value (podMatch.value), what a
// perfect tier-aware choice among the allowed pods gains over a perfect
// tier-blind one in their true states: the best pod's value less the mean
// value of the pods holding the longest prefix on any tier (a tier-blind
// router cannot tell them apart, and breaks their tie at random). It is 0
// when no pod holds a block of the prompt, or when the longest holders
// are also the best ones, as they are whenever no holder has a block on
// the CPU tier only.
func tierHeadroom(matches []podMatch) float64 {
	bestAny, bestValue := 0, 0.0
	blindSum, blind := 0.0, 0
	for _, m := range matches {
		if !m.ok {
			continue
		}
		v := m.value()
		bestValue = max(bestValue, v)
		switch n := m.gpu + m.cpu; {
		case n > bestAny:
			bestAny, blindSum, blind = n, v, 1
		case n == bestAny && n > 0:
			blindSum += v
			blind++
		}
	}
	if blind == 0 {
		return 0
	}
	if room := bestValue - blindSum/float64(blind); room > 1e-9 {
		return room
	}
	return 0 // equal values, up to the mean's rounding
}

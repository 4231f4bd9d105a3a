package gie

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"

	"github.com/kvindex/kvindex/client"
)

// ProducerType is the plugin type of the kvindex producer.
const ProducerType = "kvindex-prefix-cache-producer"

// Producer is the kvindex-prefix-cache-producer plugin: the GIE adapter of
// a Matcher. See the package doc for what it does, and docs/router.md for
// its parameters.
type Producer struct {
	typedName plugin.TypedName
	params    ProducerParams
	matcher   *Matcher
	tokenizer *Tokenizer
	ids       IdentityMapper
	metrics   *Metrics
	// check tells identity mismatches and unknown models from cold
	// caches (nil: off, or the index cannot list endpoints).
	check *identityCheck

	// logEvery bounds the fallback log lines; sinceLog counts the
	// fallbacks since the last one.
	logEvery rate.Sometimes
	sinceLog atomic.Int64
	// rr spreads tokenize calls over the candidates.
	rr atomic.Uint64
	// now is the clock of the latency metrics.
	now func() time.Time
}

var (
	_ requestcontrol.PrepareDataPlugin = (*Producer)(nil)
	_ requestcontrol.PreRequest        = (*Producer)(nil)
)

// NewProducer returns a producer named name (ProducerType when empty)
// with params, asking index. A zero field of params means its default
// (ProducerParams.FillDefaults), so a hand-built or partial value works;
// out-of-range values are an error. metrics nil means a private,
// unregistered set.
func NewProducer(name string, params ProducerParams, index Index, metrics *Metrics) (*Producer, error) {
	params.FillDefaults()
	if err := params.Validate(); err != nil {
		return nil, err
	}
	if name == "" {
		name = ProducerType
	}
	if metrics == nil {
		metrics = NewMetrics()
	}
	var spec *Speculative
	if ttl := time.Duration(*params.SpeculativeTTL); ttl > 0 {
		spec = NewSpeculative(ttl, time.Duration(*params.SpeculativeIndexLag), params.SpeculativeMaxEntries, params.BlockSize, nil)
	}
	m, err := NewMatcher(params.matcherConfig(), index, spec)
	if err != nil {
		return nil, err
	}
	tok, err := NewTokenizer(params.tokenizerConfig())
	if err != nil {
		return nil, err
	}
	lister, _ := index.(EndpointLister)
	return &Producer{
		check:     newIdentityCheck(lister, params, metrics, time.Now),
		typedName: plugin.TypedName{Type: ProducerType, Name: name},
		params:    params,
		matcher:   m,
		tokenizer: tok,
		ids:       params.identityMapper(),
		metrics:   metrics,
		logEvery:  rate.Sometimes{Interval: time.Duration(params.FallbackLogInterval)},
		now:       time.Now,
	}, nil
}

// ProducerFactory returns the EPP factory of kvindex-prefix-cache-producer:
// it parses the parameters, dials indexd (client.New does not connect;
// the first Lookup does) and closes the connection when the handle's
// context ends. Every producer it builds counts into metrics.
func ProducerFactory(metrics *Metrics) plugin.FactoryFunc {
	return func(name string, raw json.RawMessage, handle plugin.Handle) (plugin.Plugin, error) {
		params, err := ParseProducerParams(raw)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", ProducerType, name, err)
		}
		idx, err := DialKVIndex(params)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", ProducerType, name, err)
		}
		if handle != nil && handle.Context() != nil {
			context.AfterFunc(handle.Context(), func() { _ = idx.Close() })
		}
		p, err := NewProducer(name, params, idx, metrics)
		if err != nil {
			_ = idx.Close()
			return nil, fmt.Errorf("%s %q: %w", ProducerType, name, err)
		}
		idx.onPartial = p.partial
		return p, nil
	}
}

// TypedName implements plugin.Plugin.
func (p *Producer) TypedName() plugin.TypedName { return p.typedName }

// Produces names the prefix match attribute (the value
// PrefixCacheMatchInfo{}, as GIE's dependency check compares values) and
// the tier attribute.
func (p *Producer) Produces() map[string]any {
	return map[string]any{
		attrprefix.PrefixCacheMatchInfoKey: attrprefix.PrefixCacheMatchInfo{},
		TierMatchKey:                       TierMatch{},
	}
}

// Consumes names the prefix match attribute too: the approximate producer
// the config loader adds for the prefix scorer produces it, so the EPP's
// dependency order always runs this producer after that one, and this
// producer's answer is the one the scorer reads.
func (p *Producer) Consumes() map[string]any {
	return map[string]any{attrprefix.PrefixCacheMatchInfoKey: attrprefix.PrefixCacheMatchInfo{}}
}

// PrepareRequestData puts each candidate's match on it. It never returns
// an error: a failure falls back (docs/router.md) so that the plugins
// after it still run and the request is still scheduled.
func (p *Producer) PrepareRequestData(ctx context.Context, req *framework.LLMRequest, endpoints []framework.Endpoint) error {
	start := p.now()
	defer func() { p.metrics.prepare.Observe(p.now().Sub(start).Seconds()) }()
	if len(endpoints) == 0 || req == nil {
		return nil
	}
	model, lora := p.params.mapModel(req.TargetModel)
	prompt, err := p.prompt(ctx, req, lora, endpoints)
	if err != nil {
		p.fallback(ctx, err, endpoints, 0)
		return nil
	}
	// tokens is what the totals count: the prompt as looked up, cut at
	// maxPromptTokens.
	tokens := p.matcher.promptTokens(prompt)
	ids := make([]Identity, len(endpoints))
	ok := make([]bool, len(endpoints))
	candidates := make([]Identity, 0, len(endpoints))
	var idErr error
	for i, ep := range endpoints {
		id, err := p.ids.Identity(endpointRef(ep))
		if err != nil {
			idErr = err
			continue
		}
		ids[i], ok[i] = id, true
		candidates = append(candidates, id)
	}
	if len(candidates) == 0 {
		p.fallback(ctx, fmt.Errorf("%w: no candidate maps to a pod identity", ErrIdentity), endpoints, tokens)
		return nil
	}
	if idErr != nil {
		// Counted once per request, as every kind is.
		p.metrics.errors.WithLabelValues(KindIdentity).Inc()
		p.logRate(ctx, "kvindex: endpoint without a pod identity gets no match", idErr)
	}
	lstart := p.now()
	p.metrics.lookups.Inc()
	matches, err := p.matcher.Match(ctx, model, prompt, candidates)
	p.metrics.lookupSecs.Observe(p.now().Sub(lstart).Seconds())
	if err != nil {
		p.fallback(ctx, err, endpoints, tokens)
		return nil
	}
	if ctx.Err() != nil {
		// The director has moved on: write nothing.
		p.fallback(ctx, ctx.Err(), endpoints, tokens)
		return nil
	}
	best, indexed := 0.0, false
	for i, ep := range endpoints {
		var em EndpointMatch
		if ok[i] {
			em = matches[ids[i]]
		} else {
			em = EndpointMatch{BlockSize: p.params.BlockSize, Total: tokens / p.params.BlockSize}
		}
		if em.BlockSize <= 0 {
			em.BlockSize = p.params.BlockSize
			em.Total = tokens / em.BlockSize
		}
		if em.Total > 0 {
			best = max(best, float64(em.Blocks)/float64(em.Total))
		}
		indexed = indexed || em.Blocks > em.Speculative
		p.metrics.speculative.Add(float64(em.Speculative))
		ep.Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(em.Blocks, em.Total, em.BlockSize))
		ep.Put(TierMatchKey, &TierMatch{GPU: em.GPU, CPU: em.CPU, Disk: em.Disk, Total: em.Total, BlockSize: em.BlockSize})
	}
	p.metrics.matchRatio.Observe(best)
	if !indexed && p.check != nil {
		// The attributes are written; the check only counts and logs.
		p.check.run(ctx, model, lora, candidates)
	}
	return nil
}

// PreRequest remembers the chosen endpoint's prompt blocks (speculative
// entries), from the tokens PrepareRequestData left in the request.
func (p *Producer) PreRequest(ctx context.Context, req *framework.LLMRequest, result *framework.SchedulingResult) {
	if req == nil || result == nil || req.TokenizedPrompt == nil || len(req.TokenizedPrompt.TokenIDs) == 0 {
		return
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return
	}
	id, err := p.ids.Identity(endpointRef(primary.TargetEndpoints[0]))
	if err != nil {
		return
	}
	model, lora := p.params.mapModel(req.TargetModel)
	p.matcher.Remember(model, promptOf(req, lora), id)
}

// prompt returns the request's prompt: the tokens an upstream plugin left
// in TokenizedPrompt, or else the tokenizer's, which it then leaves there
// for the plugins after it (and its own PreRequest).
func (p *Producer) prompt(ctx context.Context, req *framework.LLMRequest, lora string, endpoints []framework.Endpoint) (Prompt, error) {
	if req.TokenizedPrompt != nil && len(req.TokenizedPrompt.TokenIDs) > 0 {
		return promptOf(req, lora), nil
	}
	treq, err := tokenizeRequest(req)
	if err != nil {
		return Prompt{}, err
	}
	hostPort := ""
	if !p.tokenizer.Fixed() {
		ep := endpoints[p.rr.Add(1)%uint64(len(endpoints))]
		md := ep.GetMetadata()
		if md == nil {
			return Prompt{}, fmt.Errorf("%w: candidate without metadata", ErrTokenize)
		}
		hostPort = net.JoinHostPort(md.Address, md.Port)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Duration(p.params.TokenizeTimeout))
	defer cancel()
	start := p.now()
	ids, err := p.tokenizer.Tokenize(tctx, hostPort, treq)
	p.metrics.tokenize.Observe(p.now().Sub(start).Seconds())
	if err != nil {
		return Prompt{}, err
	}
	if ctx.Err() != nil {
		return Prompt{}, ctx.Err()
	}
	req.TokenizedPrompt = &framework.TokenizedPrompt{TokenIDs: ids}
	return promptOf(req, lora), nil
}

// promptOf builds the core's Prompt from a request holding tokens.
func promptOf(req *framework.LLMRequest, lora string) Prompt {
	p := Prompt{TokenIDs: req.TokenizedPrompt.TokenIDs, LoRAName: lora}
	if req.Body != nil {
		p.CacheSalt = req.Body.CacheSalt()
	}
	for _, f := range req.TokenizedPrompt.MultiModalFeatures {
		p.MultiModal = append(p.MultiModal, MultiModalItem{Hash: f.Hash, Offset: f.Offset, Length: f.Length})
	}
	return p
}

// chatTemplateFields are the chat request fields vLLM's /tokenize reads to
// build the templated prompt.
var chatTemplateFields = []string{
	"messages", "tools", "documents", "chat_template", "chat_template_kwargs",
	"add_generation_prompt", "continue_final_message", "mm_processor_kwargs",
}

// tokenizeRequest turns a completions or chat completions request into a
// TokenizeRequest; other APIs give ErrNoPrompt. A completions prompt
// given as an array is tokenized by its first element (the array is a
// batch of prompts served by one endpoint; the first stands for them).
func tokenizeRequest(req *framework.LLMRequest) (TokenizeRequest, error) {
	b := req.Body
	if b == nil {
		return TokenizeRequest{}, ErrNoPrompt
	}
	tr := TokenizeRequest{Model: req.TargetModel}
	switch {
	case b.Completions != nil:
		tr.Prompt = b.Completions.Prompt.Raw
		if tr.Prompt == "" && len(b.Completions.Prompt.Strings) > 0 {
			tr.Prompt = b.Completions.Prompt.Strings[0]
		}
		if tr.Prompt == "" {
			return tr, ErrNoPrompt
		}
	case b.ChatCompletions != nil:
		if len(b.ChatCompletions.Messages) == 0 {
			return tr, ErrNoPrompt
		}
		tr.Chat = map[string]any{}
		if pm, ok := b.Payload.(framework.PayloadMap); ok {
			// The request's own fields, as it sent them (defaults such as
			// add_generation_prompt stay the server's).
			for _, k := range chatTemplateFields {
				if v, ok := pm[k]; ok {
					tr.Chat[k] = v
				}
			}
		}
		if _, ok := tr.Chat["messages"]; !ok {
			c := b.ChatCompletions
			tr.Chat["messages"] = c.Messages
			tr.Chat["add_generation_prompt"] = c.AddGenerationPrompt
			tr.Chat["continue_final_message"] = c.ContinueFinalMessage
			if len(c.Tools) > 0 {
				tr.Chat["tools"] = c.Tools
			}
			if c.ChatTemplate != "" {
				tr.Chat["chat_template"] = c.ChatTemplate
			}
			if len(c.ChatTemplateKWArgs) > 0 {
				tr.Chat["chat_template_kwargs"] = c.ChatTemplateKWArgs
			}
		}
	default:
		return tr, ErrNoPrompt
	}
	return tr, nil
}

// endpointRef reads what the identity mapping needs of an endpoint.
func endpointRef(ep framework.Endpoint) EndpointRef {
	md := ep.GetMetadata()
	if md == nil {
		return EndpointRef{}
	}
	return EndpointRef{
		Namespace: md.NamespacedName.Namespace, Name: md.NamespacedName.Name,
		PodName: md.PodName, Address: md.Address, Port: md.Port,
	}
}

// partial counts a cell-mode answer some cell did not give as a fallback
// (reason partial) and logs it at a bounded rate; the answer itself is
// used.
func (p *Producer) partial(ctx context.Context, failed []client.CellError) {
	p.metrics.errors.WithLabelValues(KindPartial).Inc()
	p.metrics.fallbacks.WithLabelValues(p.params.Fallback, KindPartial).Inc()
	errs := make([]error, len(failed))
	for i, f := range failed {
		errs[i] = fmt.Errorf("cell %s: %w", f.Cell, f.Err)
	}
	p.logRate(ctx, "kvindex: partial answer, some cells did not answer", errors.Join(errs...))
}

// fallback counts and logs (at a bounded rate) a request kvindex did not
// answer, and with fallback none writes zero matches over a prompt of
// tokens tokens, unless ctx has ended.
func (p *Producer) fallback(ctx context.Context, err error, endpoints []framework.Endpoint, tokens int) {
	kind := errorKind(err)
	p.metrics.errors.WithLabelValues(kind).Inc()
	p.metrics.fallbacks.WithLabelValues(p.params.Fallback, kind).Inc()
	p.logRate(ctx, "kvindex: no usable answer from the index; falling back", err, "fallback", p.params.Fallback, "kind", kind)
	if p.params.Fallback != FallbackNone || ctx.Err() != nil {
		return
	}
	bs := p.params.BlockSize
	for _, ep := range endpoints {
		ep.Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(0, tokens/bs, bs))
		ep.Put(TierMatchKey, &TierMatch{Total: tokens / bs, BlockSize: bs})
	}
}

// logRate logs msg at most once per FallbackLogInterval, with the number
// of events since the last line.
func (p *Producer) logRate(ctx context.Context, msg string, err error, kv ...any) {
	p.sinceLog.Add(1)
	p.logEvery.Do(func() {
		n := p.sinceLog.Swap(0)
		log.FromContext(ctx).Error(err, msg, append(kv, "events_since_last_log", n)...)
	})
}

// errorKind classifies a failure for the metrics' labels.
func errorKind(err error) string {
	var ie *IndexError
	switch {
	case errors.Is(err, ErrNoPrompt):
		return KindNoPrompt
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return KindDeadline
	case errors.Is(err, ErrTokenize):
		return KindTokenize
	case errors.Is(err, ErrIdentity):
		return KindIdentity
	case errors.Is(err, ErrStale):
		return KindStale
	case errors.As(err, &ie):
		return ie.Kind
	}
	return KindOther
}

package gie

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// Limits of the identity check.
const (
	// identityCheckLimit is the most indexed endpoints one check reads
	// (indexd's largest page). A model with more, none of them a
	// candidate, is not called a mismatch: the candidates may be past
	// the page.
	identityCheckLimit = 2000
	// maxModelLabels bounds the model label values of the mismatch and
	// unknown-model counters: request models are caller input.
	maxModelLabels = 32
	// maxCheckedModels bounds the per-model check times kept; past it
	// they are forgotten (each model may then be checked once more).
	maxCheckedModels = 1024
	// identityCheckBurst is how many checks may run back to back; past it
	// checks of any models together run at most maxModelLabels per
	// interval. Request models are caller input, so the per-model
	// interval alone would let a stream of new names make a listing each.
	identityCheckBurst = 4
)

// identityCheck tells an identity mismatch and an unknown model from a
// cold cache when a Lookup matched no candidate: at most once per
// interval per model, and maxModelLabels per interval for all models
// together, it lists the endpoints the index holds (EndpointLister),
// counts what it finds and logs it at a bounded rate. A check runs on the
// request's path after its attributes are written, within budget (the
// lookup timeout) in all. It is safe for concurrent use.
type identityCheck struct {
	lister   EndpointLister
	interval time.Duration
	// budget bounds one check's listings together.
	budget time.Duration
	// all bounds the checks of all models together (identityCheckBurst).
	all *rate.Limiter
	// bases are the configured base models (ProducerParams.Models'
	// kvindex models); empty means any model the index holds.
	bases   []string
	podMode string
	metrics *Metrics
	now     func() time.Time
	logRate rate.Sometimes

	mu      sync.Mutex
	checked map[string]time.Time // model → last check
	labels  map[string]bool      // model label values in use
}

func newIdentityCheck(lister EndpointLister, params ProducerParams, metrics *Metrics, now func() time.Time) *identityCheck {
	if lister == nil || params.IdentityCheckInterval == nil || *params.IdentityCheckInterval <= 0 {
		return nil
	}
	var bases []string
	for _, m := range params.Models {
		b := m.Model
		if b == "" {
			b = m.Match
		}
		if !slices.Contains(bases, b) {
			bases = append(bases, b)
		}
	}
	iv := time.Duration(*params.IdentityCheckInterval)
	mode := params.PodIdentity
	if mode == "" {
		mode = PodIdentityAddressPort
	}
	return &identityCheck{
		lister: lister, interval: iv, bases: bases, podMode: mode, metrics: metrics, now: now,
		budget:  time.Duration(params.LookupTimeout),
		all:     rate.NewLimiter(rate.Every(iv/maxModelLabels), identityCheckBurst),
		logRate: rate.Sometimes{Interval: iv},
		checked: map[string]time.Time{}, labels: map[string]bool{},
	}
}

// due reports whether model may be checked now (its interval passed, and
// the bound on all models allows one more), and marks it checked.
func (c *identityCheck) due(model string) bool {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.checked[model]; ok && now.Sub(last) < c.interval {
		return false
	}
	if !c.all.AllowN(now, 1) {
		return false
	}
	if len(c.checked) >= maxCheckedModels {
		clear(c.checked)
	}
	c.checked[model] = now
	return true
}

// forget unmarks model, whose check did not finish, so the next Lookup
// that matches nothing may check it again (within the bound on all).
func (c *identityCheck) forget(model string) {
	c.mu.Lock()
	delete(c.checked, model)
	c.mu.Unlock()
}

// label returns model as a label value, or "other" past maxModelLabels
// distinct values.
func (c *identityCheck) label(model string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.labels[model] {
		return model
	}
	if len(c.labels) >= maxModelLabels {
		return "other"
	}
	c.labels[model] = true
	return model
}

// run checks a Lookup of model (LoRA lora) that matched none of
// candidates, when due, within c.budget. A failed listing ends the check
// uncounted, and the model may be checked again at its next empty Lookup.
func (c *identityCheck) run(ctx context.Context, model, lora string, candidates []Identity) {
	if len(candidates) == 0 || !c.due(model) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.budget)
	defer cancel()
	indexed, err := c.lister.IndexedEndpoints(ctx, model, identityCheckLimit)
	if err != nil {
		c.forget(model)
		return
	}
	if len(indexed) == 0 {
		c.unknownModel(ctx, model, lora)
		return
	}
	if len(indexed) >= identityCheckLimit {
		return
	}
	for _, id := range indexed {
		if slices.Contains(candidates, id) {
			return // a cold prefix, not a mismatch
		}
	}
	c.metrics.mismatch.WithLabelValues(c.label(model)).Inc()
	c.logRate.Do(func() {
		log.FromContext(ctx).Error(fmt.Errorf("%w: no candidate is an endpoint the index holds", ErrIdentity),
			"kvindex: WARN pod identity mismatch: the index holds endpoints of the model but none of the candidates; check podIdentity and ranks against the bridges' --pod and --dp-rank",
			"model", model, "podIdentity", c.podMode,
			"candidate", fmt.Sprintf("%s rank %d", candidates[0].Pod, candidates[0].Rank),
			"indexed", fmt.Sprintf("%s rank %d", indexed[0].Pod, indexed[0].Rank),
			"candidates", len(candidates), "indexed_endpoints", len(indexed))
	})
}

// unknownModel counts and logs model when a configured base model (any
// model when none is configured) has endpoints in the index.
func (c *identityCheck) unknownModel(ctx context.Context, model, lora string) {
	bases := c.bases
	if len(bases) == 0 {
		bases = []string{""}
	}
	for _, b := range bases {
		if b == model {
			continue
		}
		ids, err := c.lister.IndexedEndpoints(ctx, b, 1)
		if err != nil || len(ids) == 0 {
			continue
		}
		c.metrics.unknown.WithLabelValues(c.label(model)).Inc()
		c.logRate.Do(func() {
			log.FromContext(ctx).Error(fmt.Errorf("%w: model %q has no endpoints in the index", ErrIdentity, model),
				"kvindex: WARN unknown model: the request's model (or adapter) is not one the index knows; add a models entry mapping it to its base model and LoRA",
				"model", model, "lora", lora, "indexed_model", b,
				"indexed", fmt.Sprintf("%s rank %d", ids[0].Pod, ids[0].Rank))
		})
		return
	}
}

package gie_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	framework "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/kvindex/kvindex/router/gie"
)

// randomIndex answers every Lookup with random matches of the
// candidates, sometimes an error, sometimes a stale answer, sometimes a
// partial tier list, and lists endpoints; safe for concurrent use.
type randomIndex struct{}

// LookupTokens answers at random, an error one time in ten.
func (randomIndex) LookupTokens(ctx context.Context, _ string, p gie.Prompt, cands []gie.Identity) (gie.IndexAnswer, error) {
	if rand.IntN(10) == 0 {
		return gie.IndexAnswer{}, &gie.IndexError{Kind: gie.KindUnavailable, Err: fmt.Errorf("injected")}
	}
	var ans gie.IndexAnswer
	ans.ProgressTime = time.Now().Add(-time.Duration(rand.IntN(2000)) * time.Millisecond)
	if rand.IntN(10) == 0 {
		ans.ProgressTime = time.Now().Add(-time.Hour) // stale: falls back
	}
	for _, c := range cands {
		if rand.IntN(2) == 0 {
			continue
		}
		bs := []int{0, 16, 32, 1 << 20}[rand.IntN(4)]
		n := rand.IntN(len(p.TokenIDs)/16 + 3)
		tiers := make([]gie.Tier, rand.IntN(n+1))
		for i := range tiers {
			tiers[i] = gie.Tier(rand.IntN(5) - 1) // out-of-range tiers too
		}
		ans.Matches = append(ans.Matches, gie.IndexMatch{Identity: c, Blocks: n, BlockSize: bs, Tiers: tiers})
	}
	return ans, nil
}

// IndexedEndpoints lists one endpoint that is never a candidate.
func (randomIndex) IndexedEndpoints(ctx context.Context, _ string, limit int) ([]gie.Identity, error) {
	return []gie.Identity{{Pod: "elsewhere:8000"}}, nil
}

// TestConcurrentProducerAttributesInRange: 32 goroutines drive one producer
// (PrepareRequestData then PreRequest, as the director does) with random
// answers, random prompts (empty, tiny, huge) and random models; under
// -race nothing may race or panic, and every attribute written must be
// in range (0 <= match <= total).
func TestConcurrentProducerAttributesInRange(t *testing.T) {
	m := gie.NewMetrics()
	p, err := gie.NewProducer("", gie.ProducerParams{Target: "unused:1", Fallback: gie.FallbackNone}, randomIndex{}, m)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				n := []int{0, 1, 15, 16, 17, 300, 70000}[rand.IntN(7)]
				req := tokenized(strings.Repeat(string(rune('a'+g%26)), n))
				if n == 0 {
					req.TokenizedPrompt = nil // goes to the tokenizer: no metadata server, falls back
				}
				req.TargetModel = fmt.Sprintf("model-%d", rand.IntN(100))
				eps := endpoints(1 + rand.IntN(5))
				_ = p.PrepareRequestData(context.Background(), req, eps)
				for _, ep := range eps {
					if mt, tot, _, ok := prefixInfo(t, ep); ok && (mt < 0 || mt > tot) {
						t.Errorf("g%d/%d: match %d of %d", g, i, mt, tot)
					}
				}
				res := &framework.SchedulingResult{PrimaryProfileName: "d", ProfileResults: map[string]*framework.ProfileRunResult{"d": {TargetEndpoints: eps[:1]}}}
				p.PreRequest(context.Background(), req, res)
			}
		}()
	}
	wg.Wait()
}

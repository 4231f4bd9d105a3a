package gie

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	attrprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/prefix"
)

// TestStaleAnswerFallsBack: DESIGN "Staleness" says a router falls back to
// its own scoring when the index is stale. The Matcher refuses an answer
// whose progress time is more than MaxStaleness old (ErrStale), and uses
// one at the bound, one without a progress time (the replica did not
// say), one from the future (a clock skew), and any with the check off.
// Before, the answer's age was never looked at.
func TestStaleAnswerFallsBack(t *testing.T) {
	holder := Identity{Pod: "a"}
	for _, tc := range []struct {
		name       string
		lag        time.Duration
		noProgress bool
		max        time.Duration
		stale      bool
	}{
		{name: "current", lag: 0, max: 30 * time.Second},
		{name: "at_the_bound", lag: 30 * time.Second, max: 30 * time.Second},
		{name: "past_the_bound", lag: 30*time.Second + time.Millisecond, max: 30 * time.Second, stale: true},
		{name: "an_hour_behind", lag: time.Hour, max: 30 * time.Second, stale: true},
		{name: "ahead_of_this_clock", lag: -time.Hour, max: 30 * time.Second},
		{name: "no_progress_time", noProgress: true, max: 30 * time.Second},
		{name: "check_off", lag: time.Hour, max: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			idx := &laggingIndex{clock: c, lag: tc.lag, noProgress: tc.noProgress,
				matches: []IndexMatch{{Identity: holder, Blocks: 2, BlockSize: 16}}}
			cfg := DefaultMatcherConfig()
			cfg.MaxStaleness = tc.max
			m, err := NewMatcher(cfg, idx, nil)
			if err != nil {
				t.Fatal(err)
			}
			m.now = c.now
			ems, err := m.Match(t.Context(), "m", Prompt{TokenIDs: seq(64)}, []Identity{holder})
			if tc.stale {
				if !errors.Is(err, ErrStale) || ems != nil || errorKind(err) != KindStale {
					t.Fatalf("Match = %v, %v (kind %q); want ErrStale, kind %q, no matches", ems, err, errorKind(err), KindStale)
				}
				if !strings.Contains(err.Error(), "maxStaleness") {
					t.Errorf("error %q does not name maxStaleness", err)
				}
				return
			}
			if err != nil || ems[holder].Blocks != 2 {
				t.Fatalf("Match = %v, %v; want the answer used (2 blocks)", ems, err)
			}
		})
	}
	cfg := DefaultMatcherConfig()
	cfg.MaxStaleness = -time.Second
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("MaxStaleness -1s: Validate = %v, want ErrInvalidConfig", err)
	}
	if d := DefaultMatcherConfig().MaxStaleness; d != 30*time.Second {
		t.Errorf("default MaxStaleness = %v, want 30s (indexd's default --max-staleness)", d)
	}
}

// TestStaleAnswerCountedAsFallback: through the producer a stale answer
// is a fallback like any other: counted in kvindex_gie_fallbacks_total
// and kvindex_gie_lookup_errors_total with reason "stale", logged at the
// bounded rate, the approximate attribute left in place (or zeroes
// written with fallback none), and no match taken from the stale index.
func TestStaleAnswerCountedAsFallback(t *testing.T) {
	for _, mode := range []string{FallbackApproximate, FallbackNone} {
		t.Run(mode, func(t *testing.T) {
			c := &clock{t: time.Unix(1000, 0)}
			idx := &laggingIndex{clock: c, lag: time.Hour,
				matches: []IndexMatch{{Identity: Identity{Pod: "10.0.0.1:8000"}, Blocks: 4, BlockSize: 16}}}
			metrics := NewMetrics()
			p, err := NewProducer("", ProducerParams{Target: "x:1", Fallback: mode}, idx, metrics)
			if err != nil {
				t.Fatal(err)
			}
			p.matcher.now = c.now
			logs := &capture{}
			ctx := log.IntoContext(t.Context(), logs.logger())
			for range 3 {
				eps := podEndpoints(2)
				for _, ep := range eps {
					// What the approximate producer would have left.
					ep.Put(attrprefix.PrefixCacheMatchInfoKey, attrprefix.NewPrefixCacheMatchInfo(1, 4, 16))
				}
				if err := p.PrepareRequestData(ctx, tokenRequest("llama"), eps); err != nil {
					t.Fatal(err)
				}
				v, _ := eps[0].Get(attrprefix.PrefixCacheMatchInfoKey)
				got := v.(*attrprefix.PrefixCacheMatchInfo).MatchBlocks()
				want := map[string]int{FallbackApproximate: 1, FallbackNone: 0}[mode]
				if got != want {
					t.Errorf("pod 0 matches %d blocks, want %d (the stale index's 4 must not be used)", got, want)
				}
			}
			if got := testutil.ToFloat64(metrics.fallbacks.WithLabelValues(mode, KindStale)); got != 3 {
				t.Errorf("fallbacks{%s,stale} = %v, want 3", mode, got)
			}
			if got := testutil.ToFloat64(metrics.errors.WithLabelValues(KindStale)); got != 3 {
				t.Errorf("lookup_errors{stale} = %v, want 3", got)
			}
			if lines := logs.matching("stale answer"); len(lines) != 1 {
				t.Errorf("%d log lines naming the stale answer after 3 fallbacks within fallbackLogInterval, want 1: %q", len(lines), logs.lines)
			} else if !strings.Contains(lines[0], `"kind"="stale"`) {
				t.Errorf("log line %q does not name kind stale", lines[0])
			}
		})
	}
}

// TestMaxStalenessParam: maxStaleness is decoded as the other durations
// are: onto its default (30 s), an explicit "0s" kept (the check off),
// and a negative, null or malformed value refused naming the field.
func TestMaxStalenessParam(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"x:1"}`))
	if err != nil || p.MaxStaleness == nil || time.Duration(*p.MaxStaleness) != DefaultMaxStaleness {
		t.Fatalf("default maxStaleness = %v, %v; want %v", p.MaxStaleness, err, DefaultMaxStaleness)
	}
	if DefaultMaxStaleness != 30*time.Second {
		t.Errorf("DefaultMaxStaleness = %v, want indexd's default --max-staleness, 30s", DefaultMaxStaleness)
	}
	p, err = ParseProducerParams([]byte(`{"target":"x:1","maxStaleness":"0s"}`))
	if err != nil || *p.MaxStaleness != 0 {
		t.Fatalf("maxStaleness \"0s\" = %v, %v; want kept as 0", p.MaxStaleness, err)
	}
	pr, err := NewProducer("", p, &laggingIndex{clock: &clock{}}, nil)
	if err != nil || pr.matcher.cfg.MaxStaleness != 0 {
		t.Fatalf("NewProducer with maxStaleness 0s: %v; matcher's MaxStaleness must stay 0", err)
	}
	p, err = ParseProducerParams([]byte(`{"target":"x:1","maxStaleness":"5s"}`))
	if err != nil || time.Duration(*p.MaxStaleness) != 5*time.Second || p.matcherConfig().MaxStaleness != 5*time.Second {
		t.Fatalf("maxStaleness \"5s\" = %v, %v", p.MaxStaleness, err)
	}
	for raw, want := range map[string]string{
		`{"target":"x:1","maxStaleness":"-1s"}`:  "maxStaleness -1s must not be negative",
		`{"target":"x:1","maxStaleness":null}`:   "maxStaleness: null: leave the field out for its default",
		`{"target":"x:1","maxStaleness":"soon"}`: `maxStaleness: time: invalid duration "soon"`,
		`{"target":"x:1","maxStaleness":30}`:     "maxStaleness: a duration is a string",
		`{"target":"x:1","MaxStaleness":"1s"}`:   `unknown field "MaxStaleness" (names are case-sensitive: "maxStaleness")`,
	} {
		if _, err := ParseProducerParams([]byte(raw)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrInvalidConfig with %q", raw, err, want)
		}
	}
}

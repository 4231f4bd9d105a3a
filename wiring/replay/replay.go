// Package replay runs scenario files (testdata/fixtures/README.md) against a
// kvindex deployment: it produces each publish step to Kafka and checks each
// lookup step with a Lookup whose read-your-events barrier names every
// record produced so far, so no step ever sleeps. `kvindex replay` and the
// e2e tests use it.
package replay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/scenario"
)

// DefaultBarrierTimeout bounds how long one lookup step waits for the
// records before it to be applied.
const DefaultBarrierTimeout = 30 * time.Second

// Target is the deployment a scenario is replayed against.
type Target struct {
	// Producer produces the publish steps. Required; the caller owns it.
	Producer *kgo.Client
	// Topic receives every record of the scenario. Required.
	Topic string
	// Index answers the lookup steps. Required; the caller owns it.
	Index *client.Client
	// BarrierTimeout bounds each lookup's wait. Default
	// DefaultBarrierTimeout.
	BarrierTimeout time.Duration
}

// Mismatch is one lookup step whose answer differs from its expectation.
type Mismatch struct {
	// Line is the step's line in the scenario file.
	Line int
	// Describe is the step's note, when it has one.
	Describe string
	// Model and Hashes are what was looked up; for a token lookup Hashes
	// are the canonical keys of Tokens at BlockSize.
	Model     string
	Hashes    []uint64
	Tokens    []uint32
	BlockSize int
	// Expected and Actual are the endpoints expected and returned.
	Expected, Actual []scenario.Match
	// Diffs says what differs, one line each.
	Diffs []string
}

// Result is the outcome of one scenario.
type Result struct {
	// Scenario is the scenario's name.
	Scenario string
	// Publishes and Lookups count the steps run.
	Publishes, Lookups int
	// Mismatches lists the lookup steps that failed; empty means the
	// scenario passed.
	Mismatches []Mismatch
	// HeldBefore lists, sorted, the scenario's models the index already
	// held endpoints of before its first step: every scenario expects an
	// empty index, so a mismatch then may be the earlier state's (a
	// scenario replayed twice, another's endpoints), not kvindex's.
	HeldBefore []string
}

// ErrTarget is wrapped by errors that stop a replay before its end (the
// deployment failed, not an expectation).
var ErrTarget = errors.New("replay: target failed")

// Run replays s against t. Expectation failures are reported in the Result;
// an error means the replay could not go on (a produce or a Lookup failed).
func Run(ctx context.Context, t Target, s *scenario.Scenario) (Result, error) {
	if t.Producer == nil || t.Index == nil || t.Topic == "" {
		return Result{}, errors.New("replay: Target needs Producer, Topic and Index")
	}
	timeout := t.BarrierTimeout
	if timeout <= 0 {
		timeout = DefaultBarrierTimeout
	}
	res := Result{Scenario: s.Name}
	res.HeldBefore = heldBefore(ctx, t.Index, s)
	// produced holds, per partition, the highest offset produced so far:
	// the barrier of every later lookup.
	produced := map[int32]int64{}
	for _, st := range s.Steps {
		switch st.Kind {
		case scenario.KindPublish:
			rec := record(t.Topic, st.Publish)
			if err := t.Producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
				return res, fmt.Errorf("%w: line %d: producing: %v", ErrTarget, st.Line, err)
			}
			if rec.Offset >= produced[rec.Partition] {
				produced[rec.Partition] = rec.Offset
			}
			res.Publishes++
		case scenario.KindLookup:
			barrier := make([]client.PartitionOffset, 0, len(produced))
			for p, off := range produced {
				barrier = append(barrier, client.PartitionOffset{Topic: t.Topic, Partition: p, Offset: off})
			}
			lctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
			var got *client.LookupResult
			var err error
			if st.Lookup.Tokens != nil {
				got, err = t.Index.LookupTokens(lctx, st.Lookup.Model, st.Lookup.Prompt(), client.WithBarrier(timeout, barrier...))
			} else {
				got, err = t.Index.Lookup(lctx, st.Lookup.Model, st.Lookup.Hashes, client.WithBarrier(timeout, barrier...))
			}
			cancel()
			if err != nil {
				return res, fmt.Errorf("%w: line %d: lookup: %v", ErrTarget, st.Line, err)
			}
			res.Lookups++
			actual := Matches(got)
			if diffs := st.Lookup.Check(actual); diffs != nil {
				res.Mismatches = append(res.Mismatches, Mismatch{
					Line: st.Line, Describe: st.Lookup.Describe, Model: st.Lookup.Model, Hashes: st.Lookup.Keys(),
					Tokens: st.Lookup.Tokens, BlockSize: st.Lookup.BlockSize,
					Expected: st.Lookup.Expect, Actual: actual, Diffs: diffs,
				})
			}
		}
	}
	return res, nil
}

// heldBefore returns, sorted, the models s publishes to or looks up that
// the index lists endpoints of now. It is a hint for a failure's report,
// so a list that fails (a replica not serving yet) counts as holding
// nothing, and the replay goes on.
func heldBefore(ctx context.Context, idx *client.Client, s *scenario.Scenario) []string {
	models := map[string]bool{}
	for _, st := range s.Steps {
		switch {
		case st.Kind == scenario.KindPublish && st.Publish.Headers[contract.HeaderModel] != "":
			models[st.Publish.Headers[contract.HeaderModel]] = true
		case st.Kind == scenario.KindLookup:
			models[st.Lookup.Model] = true
		}
	}
	var held []string
	for _, m := range slices.Sorted(maps.Keys(models)) {
		// One endpoint answers the question: a page of one, not the list.
		if page, err := idx.ListEndpointsPage(ctx, m, 1, ""); err == nil && len(page.Endpoints) > 0 {
			held = append(held, m)
		}
	}
	return held
}

// record builds the Kafka record of a publish step: key, headers in sorted
// order, value as given (an empty value is a record with no value).
func record(topic string, p *scenario.Publish) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: []byte(p.Key)}
	if len(p.Value) > 0 {
		r.Value = p.Value
	}
	for _, k := range p.HeaderKeys() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(p.Headers[k])})
	}
	return r
}

// Matches converts a Lookup answer to the scenario form.
func Matches(r *client.LookupResult) []scenario.Match {
	out := make([]scenario.Match, 0, len(r.Matches))
	for _, m := range r.Matches {
		tiers := make([]string, len(m.Tiers))
		for i, t := range m.Tiers {
			tiers[i] = t.String()
		}
		out = append(out, scenario.Match{Pod: m.Endpoint.Pod, DPRank: m.Endpoint.DPRank, Blocks: m.Blocks, Tiers: tiers, BlockSize: m.BlockSize})
	}
	return out
}

// ProbeModel is the model of the record HashMode produces to learn a
// deployment's hash mode; no scenario uses it.
const ProbeModel = "kvindex-replay-probe"

// ErrHashMode is wrapped by HashMode's error when a deployment's ingesters
// run in another hash mode than a scenario's.
var ErrHashMode = errors.New("replay: the deployment's hash mode differs from the scenario's")

// HashMode learns the hash mode of the deployment t names: it produces a
// heartbeat of a probe endpoint (model ProbeModel, pod pod), waits until
// indexd reflects it, reads the endpoint's hash mode from ListEndpoints,
// and produces a goodbye so the probe leaves no endpoint behind. The
// answer is scenario.HashModeToken or scenario.HashModeEngine.
func HashMode(ctx context.Context, t Target, pod string) (string, error) {
	timeout := t.BarrierTimeout
	if timeout <= 0 {
		timeout = DefaultBarrierTimeout
	}
	probe := func(kind string) (*kgo.Record, error) {
		rec := &kgo.Record{Topic: t.Topic, Key: []byte(pod), Headers: []kgo.RecordHeader{{Key: "kind", Value: []byte(kind)}, {Key: "model", Value: []byte(ProbeModel)}}}
		if err := t.Producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return nil, fmt.Errorf("%w: producing the hash-mode probe: %v", ErrTarget, err)
		}
		return rec, nil
	}
	rec, err := probe("heartbeat")
	if err != nil {
		return "", err
	}
	defer func() { _, _ = probe("goodbye") }()
	lctx, cancel := context.WithTimeout(ctx, timeout+5*time.Second)
	defer cancel()
	barrier := client.PartitionOffset{Topic: t.Topic, Partition: rec.Partition, Offset: rec.Offset}
	if _, err := t.Index.Lookup(lctx, ProbeModel, []uint64{0}, client.WithBarrier(timeout, barrier)); err != nil {
		return "", fmt.Errorf("%w: waiting for the hash-mode probe: %v", ErrTarget, err)
	}
	list, err := t.Index.ListEndpoints(lctx, ProbeModel)
	if err != nil {
		return "", fmt.Errorf("%w: listing the hash-mode probe: %v", ErrTarget, err)
	}
	for _, ep := range list.Endpoints {
		if ep.Endpoint.Pod != pod {
			continue
		}
		switch ep.HashMode {
		case client.HashModeToken:
			return scenario.HashModeToken, nil
		case client.HashModeEngine:
			return scenario.HashModeEngine, nil
		}
		return "", fmt.Errorf("%w: the probe endpoint reports hash mode %v", ErrTarget, ep.HashMode)
	}
	return "", fmt.Errorf("%w: the hash-mode probe is not listed", ErrTarget)
}

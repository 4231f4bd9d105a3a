package events

import (
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvindex/kvindex/internal/scenario"
)

// TestDecodeIntoMatchesDecode decodes every fixture payload and v1.1 seed,
// big ones and truncated (malformed) ones among them, in a seeded random
// order through one decoder's DecodeInto into one reused Batch, and checks
// each result against a fresh decoder's Decode: reused memory must never
// leak a field, an event or a hash of the batch before. It also checks
// that a batch Decode returned is not overwritten by the DecodeInto calls
// after it, and that the reused batch's spare capacity holds nothing of
// the batches before.
func TestDecodeIntoMatchesDecode(t *testing.T) {
	var payloads [][]byte
	for _, s := range loadFixtures(t) {
		for _, st := range s.Steps {
			if st.Kind == scenario.KindPublish {
				payloads = append(payloads, st.Publish.Value)
			}
		}
	}
	payloads = append(payloads, v11Seeds(t)...)
	for _, p := range payloads[:len(payloads):len(payloads)] {
		if len(p) > 2 {
			payloads = append(payloads, p[:len(p)/2]) // malformed: truncated
		}
	}
	seed := rand.Int63()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)

	dec := NewDecoder(nil)
	var into Batch
	// kept is a batch of dec's Decode, checked after every DecodeInto.
	keptPayload := payloads[0]
	kept, keptErr := dec.Decode(keptPayload)
	for round := 0; round < 4; round++ {
		rng.Shuffle(len(payloads), func(i, j int) { payloads[i], payloads[j] = payloads[j], payloads[i] })
		for i, p := range payloads {
			want, wantErr := NewDecoder(nil).Decode(p)
			err := dec.DecodeInto(&into, p)
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("seed %d round %d payload %d: DecodeInto error %v, Decode error %v", seed, round, i, err, wantErr)
			}
			if err != nil && len(into.Events)+len(into.Skipped) != 0 {
				t.Fatalf("seed %d round %d payload %d: DecodeInto failed but left %d events, %d skipped", seed, round, i, len(into.Events), len(into.Skipped))
			}
			for k, ev := range into.Events[len(into.Events):cap(into.Events)] {
				if !cmp.Equal(ev, Event{}) {
					t.Fatalf("seed %d round %d payload %d: spare event %d of the reused batch still holds %+v (keeps an earlier batch's memory alive)", seed, round, i, k, ev)
				}
			}
			if diff := cmp.Diff(want, into, cmpopts.EquateEmpty()); err == nil && diff != "" {
				t.Fatalf("seed %d round %d payload %d: DecodeInto differs from Decode (-Decode +DecodeInto):\n%s", seed, round, i, diff)
			}
		}
		again, againErr := NewDecoder(nil).Decode(keptPayload)
		if (keptErr == nil) != (againErr == nil) {
			t.Fatalf("kept payload: errors %v then %v", keptErr, againErr)
		}
		if diff := cmp.Diff(again, kept); diff != "" {
			t.Fatalf("seed %d round %d: a batch of Decode changed under DecodeInto (-fresh +kept):\n%s", seed, round, diff)
		}
	}
}

package bench

import (
	"strconv"
	"testing"

	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/sim/refmodel"
)

// TestBuildStream checks the stream is what a bridge would produce from
// the simulated fleet: per-pod sequence numbers from 1 without gaps,
// payloads that decode to the counted events and block operations, and
// totals that match the fleet's own count.
func TestBuildStream(t *testing.T) {
	trace := loadTestTrace(t)
	s, err := BuildStream(trace, StreamConfig{Endpoints: 4, GPUBlocks: 64, CPUBlocks: 128, Requests: 400})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Records) == 0 || s.Stats.Requests != 400 {
		t.Fatalf("%d records from %d requests", len(s.Records), s.Stats.Requests)
	}
	dec := events.NewDecoder(nil)
	next := map[string]uint64{}
	var evs, ops int
	for i := range s.Records {
		r := &s.Records[i]
		if r.Seq != next[r.Pod]+1 {
			t.Fatalf("record %d of %s has seq %d after %d", i, r.Pod, r.Seq, next[r.Pod])
		}
		next[r.Pod] = r.Seq
		b, err := dec.Decode(r.Value)
		if err != nil || len(b.Skipped) > 0 {
			t.Fatalf("record %d: %v, skipped %v", i, err, b.Skipped)
		}
		n := 0
		for _, ev := range b.Events {
			n += len(ev.BlockHashes)
		}
		if len(b.Events) != r.Events || n != r.BlockOps {
			t.Fatalf("record %d decodes to %d events, %d block ops; counted %d, %d", i, len(b.Events), n, r.Events, r.BlockOps)
		}
		kr := s.KafkaRecord("t", i)
		if string(kr.Key) != r.Pod || len(kr.Headers) != 2 || kr.Headers[0].Key != "model" || string(kr.Headers[1].Value) != strconv.FormatUint(r.Seq, 10) {
			t.Fatalf("record %d as Kafka record: key %q headers %v", i, kr.Key, kr.Headers)
		}
		evs += r.Events
		ops += r.BlockOps
	}
	if len(next) != 4 {
		t.Fatalf("records from %d pods, want 4", len(next))
	}
	if evs != s.Events || ops != s.BlockOps || ops != s.Stats.BlockOps || evs != s.Stats.Events {
		t.Fatalf("records sum to %d events, %d block ops; stream says %d, %d; fleet %d, %d", evs, ops, s.Events, s.BlockOps, s.Stats.Events, s.Stats.BlockOps)
	}
	// The records applied in order by the reference model are accepted.
	m := refmodel.New(refmodel.Config{})
	for i := range s.Records {
		kr := s.KafkaRecord("t", i)
		hs := map[string]string{}
		for _, h := range kr.Headers {
			hs[h.Key] = string(h.Value)
		}
		if out := m.Apply(refmodel.Record{Key: string(kr.Key), Headers: hs, Value: kr.Value}); out != refmodel.Applied {
			t.Fatalf("record %d: the reference model skipped it: %s", i, out)
		}
	}
}

// Package kvevents produces vLLM KV event batches to a kvindex stack's
// Kafka topic exactly as kvindex bridge does: one record per batch, keyed
// by the pod, with the model, seq and dp_rank headers, the value the
// engine's msgpack payload (internal/events). The e2e tests and the
// routing simulator (cmd/kvindex-sim) stand in for the bridges of their
// pods with it.
package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/internal/events"
)

// Publisher is the bridges of a set of pods: it numbers each (pod, rank)
// stream's records (the seq header) and produces them to one topic. It is
// safe for concurrent use; records of one (pod, rank) keep their order
// when one goroutine publishes them.
type Publisher struct {
	prod  *kgo.Client
	topic string

	mu  sync.Mutex
	seq map[string]uint64

	wg      sync.WaitGroup
	errMu   sync.Mutex
	errs    int
	lastErr error
}

// New returns a Publisher producing to topic on the brokers (host:port).
// Records are partitioned by key (the pod), as the bridge's are, and not
// lingered. Close it.
func New(brokers []string, topic string) (*Publisher, error) {
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.MaxBufferedRecords(100000))
	if err != nil {
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	return &Publisher{prod: prod, topic: topic, seq: map[string]uint64{}}, nil
}

// record builds the next record of pod's rank for model.
func (p *Publisher) record(model, pod string, rank uint32, evs []events.Event) (*kgo.Record, error) {
	payload, err := events.Encode(events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Rank: rank, HasRank: true, Events: evs}, events.EncodingMap)
	if err != nil {
		return nil, fmt.Errorf("kvevents: encoding a batch of %s: %w", pod, err)
	}
	key := pod + "/" + strconv.Itoa(int(rank))
	p.mu.Lock()
	p.seq[key]++
	seq := p.seq[key]
	p.mu.Unlock()
	return &kgo.Record{Topic: p.topic, Key: []byte(pod), Value: payload, Headers: []kgo.RecordHeader{
		{Key: "model", Value: []byte(model)},
		{Key: "seq", Value: []byte(strconv.FormatUint(seq, 10))},
		{Key: "dp_rank", Value: []byte(strconv.Itoa(int(rank)))},
	}}, nil
}

// Publish produces one batch of evs from pod's rank and waits for the
// broker's acknowledgement (or ctx's end).
func (p *Publisher) Publish(ctx context.Context, model, pod string, rank uint32, evs []events.Event) error {
	rec, err := p.record(model, pod, rank, evs)
	if err != nil {
		return err
	}
	if err := p.prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("kvevents: producing a batch of %s: %w", pod, err)
	}
	return nil
}

// PublishAsync produces one batch of evs without waiting; a failure is
// counted (Errors) instead of returned. ctx bounds the buffering of the
// record, not its delivery. Flush waits for every record published so
// far.
func (p *Publisher) PublishAsync(ctx context.Context, model, pod string, rank uint32, evs []events.Event) error {
	rec, err := p.record(model, pod, rank, evs)
	if err != nil {
		return err
	}
	p.wg.Add(1)
	p.prod.Produce(ctx, rec, func(_ *kgo.Record, err error) {
		defer p.wg.Done()
		if err != nil {
			p.errMu.Lock()
			p.errs++
			p.lastErr = err
			p.errMu.Unlock()
		}
	})
	return nil
}

// Flush waits until every record published so far is acknowledged or
// failed, or until ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	if err := p.prod.Flush(ctx); err != nil {
		return fmt.Errorf("kvevents: flushing: %w", err)
	}
	p.wg.Wait()
	return nil
}

// Errors returns how many asynchronous publishes failed, and the last
// failure.
func (p *Publisher) Errors() (int, error) {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.errs, p.lastErr
}

// Close flushes (bounded by ctx) and closes the producer.
func (p *Publisher) Close(ctx context.Context) error {
	err := p.Flush(ctx)
	p.prod.Close()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Package bridgetest runs bridges in tests and reads back what they
// produced: a Kafka consumer that returns records in partition order in a
// comparable form, and a runner for Bridge.Run. The bridge's own tests use
// it against enginesim and kfake; the full-pipeline tests (bridge → Kafka →
// ingester → etcd → indexd) reuse it.
package bridgetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/bridge"
	"github.com/kvindex/kvindex/internal/contract"
)

// Record is a consumed record in a form go-cmp compares.
type Record struct {
	// Partition is the partition the record was read from.
	Partition int32
	// Key is the record key (the pod).
	Key string
	// Headers are the record headers by name (the contract has no repeated
	// header).
	Headers map[string]string
	// Value is the record value; nil for a record without one.
	Value []byte
}

// Kind returns the record's kind header, "" for a batch record.
func (r Record) Kind() string { return r.Headers[contract.HeaderKind] }

// Seq returns the record's seq header parsed; ok is false without one.
func (r Record) Seq() (seq uint64, ok bool) {
	s, ok := r.Headers[contract.HeaderSeq]
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// BatchRecord is the record the bridge must produce for batch seq with
// payload, for endpoint (pod, model, rank).
func BatchRecord(pod, model string, rank uint32, seq uint64, payload []byte) Record {
	return Record{Key: pod, Value: payload, Headers: map[string]string{
		contract.HeaderModel:  model,
		contract.HeaderSeq:    strconv.FormatUint(seq, 10),
		contract.HeaderDPRank: strconv.FormatUint(uint64(rank), 10),
	}}
}

// ControlRecord is the kind record the bridge must produce for endpoint
// (pod, model, rank).
func ControlRecord(pod, model string, rank uint32, kind string) Record {
	return Record{Key: pod, Headers: map[string]string{
		contract.HeaderModel:  model,
		contract.HeaderDPRank: strconv.FormatUint(uint64(rank), 10),
		contract.HeaderKind:   kind,
	}}
}

// Consumer reads one topic from its start, without a group.
type Consumer struct {
	cl    *kgo.Client
	topic string
	read  int64
	buf   []Record
}

// NewConsumer starts a consumer of topic; t.Cleanup closes it.
func NewConsumer(t testing.TB, brokers []string, topic string) *Consumer {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("bridgetest: consumer: %v", err)
	}
	t.Cleanup(cl.Close)
	return &Consumer{cl: cl, topic: topic}
}

// Read returns the next n records (records of one partition in offset
// order), or an error when ctx ends first, with what was read so far.
func (c *Consumer) Read(ctx context.Context, n int) ([]Record, error) {
	for len(c.buf) < n {
		fs := c.cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			got := c.buf
			c.buf = nil
			return got, fmt.Errorf("bridgetest: read %d of %d records: %w", len(got), n, err)
		}
		for _, e := range fs.Errors() {
			if !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("bridgetest: fetch %s/%d: %w", e.Topic, e.Partition, e.Err)
			}
		}
		fs.EachRecord(func(r *kgo.Record) {
			c.read++
			rec := Record{Partition: r.Partition, Key: string(r.Key), Headers: map[string]string{}}
			if len(r.Value) > 0 {
				rec.Value = r.Value
			}
			for _, h := range r.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			c.buf = append(c.buf, rec)
		})
	}
	got := c.buf[:n:n]
	c.buf = c.buf[n:]
	return got, nil
}

// ReadAll returns every record of the topic not read yet, up to the
// partitions' current end offsets.
func (c *Consumer) ReadAll(ctx context.Context) ([]Record, error) {
	ends, err := kadm.NewClient(c.cl).ListEndOffsets(ctx, c.topic)
	if err != nil {
		return nil, fmt.Errorf("bridgetest: end offsets: %w", err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	return c.Read(ctx, int(total-c.read+int64(len(c.buf))))
}

// Running is a Bridge.Run in progress.
type Running struct {
	B        *bridge.Bridge
	cancel   context.CancelFunc
	finished chan struct{}
	err      error
	// read is set once the test has been handed Run's error (Stop or Err),
	// so the cleanup does not report it a second time.
	read atomic.Bool
}

// Start runs b.Run in a goroutine. Stop ends it; t.Cleanup stops it too
// and fails the test with Run's error if the test never read it.
func Start(t testing.TB, b *bridge.Bridge) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{B: b, cancel: cancel, finished: make(chan struct{})}
	go func() {
		defer close(r.finished)
		r.err = b.Run(ctx)
	}()
	t.Cleanup(func() {
		unread := !r.read.Load()
		r.cancel()
		<-r.finished
		if unread && r.err != nil {
			t.Errorf("bridge Run: %v", r.err)
		}
	})
	return r
}

// Stop cancels Run's context (a SIGTERM), waits for Run to return after
// its shutdown (flush, grace period, goodbye or not) and returns its
// error. Safe to call more than once.
func (r *Running) Stop() error {
	r.cancel()
	<-r.finished
	r.read.Store(true)
	return r.err
}

// Done is closed when Run has returned (by itself on a fatal error, or
// after Stop); Err is its error then.
func (r *Running) Done() <-chan struct{} { return r.finished }

// Err returns Run's error once Done is closed.
func (r *Running) Err() error {
	<-r.finished
	r.read.Store(true)
	return r.err
}

// WaitReady waits until b.Ready returns nil or ctx ends. Readiness is
// state the bridge exposes only by polling, so this polls every 5 ms.
func WaitReady(ctx context.Context, b *bridge.Bridge) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		err := b.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bridgetest: bridge not ready: %v: %w", err, ctx.Err())
		case <-t.C:
		}
	}
}

package bridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kvindex/kvindex/client/cellmap"
	"github.com/kvindex/kvindex/internal/contract"
)

// CellSource supplies the cell map the bridge routes by (Config.Cells): a
// *cellmap.Map or a *cellmap.Watcher. Current must be safe for
// concurrent use and never return nil.
type CellSource interface {
	Current() *cellmap.Map
}

// cellRouter sends each record to its cell (Config.Cells). It is used by
// the produce loop only (and by the shutdown goodbye, after that loop has
// ended), so its maps need no lock; clients has one for Ready's metrics.
//
// A mapping change is applied at the endpoint's next record (a heartbeat
// at the latest, every HeartbeatInterval): the records already handed to
// Kafka are flushed first (every cell's), then a goodbye goes to the old
// cell (the endpoint is dropped there) and a resync to the new one (a
// fresh start: nothing of it is left there), and the record follows in
// the new cell. An endpoint is so never indexed in two cells at once by
// this bridge; what the engine held before the move is indexed again only
// as it stores blocks anew (a missed hit, never a ghost).
type cellRouter struct {
	b    *Bridge
	src  CellSource
	opts []kgo.Opt // the Kafka options without seed brokers
	def  *kgo.Client

	mu      sync.Mutex
	clients map[string]*kgo.Client  // by comma-joined brokers of cells with their own; guarded by mu
	at      map[string]cellmap.Cell // endpoint (pod NUL rank) → the cell its records go to
}

func newCellRouter(b *Bridge, src CellSource, opts []kgo.Opt, def *kgo.Client) *cellRouter {
	return &cellRouter{b: b, src: src, opts: opts, def: def, clients: map[string]*kgo.Client{}, at: map[string]cellmap.Cell{}}
}

// client returns the Kafka client of cell's brokers.
func (c *cellRouter) client(cell cellmap.Cell) (*kgo.Client, error) {
	if len(cell.Brokers) == 0 {
		return c.def, nil
	}
	key := strings.Join(cell.Brokers, ",")
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[key]; cl != nil {
		return cl, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cell.Brokers...)}, c.opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bridge: Kafka client of cell %s: %w", cell.Name, err)
	}
	c.clients[key] = cl
	return cl, nil
}

// all returns every Kafka client.
func (c *cellRouter) all() []*kgo.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []*kgo.Client{c.def}
	for _, cl := range c.clients {
		out = append(out, cl)
	}
	return out
}

// flush flushes every client.
func (c *cellRouter) flush(ctx context.Context) error {
	var errs []error
	for _, cl := range c.all() {
		errs = append(errs, cl.Flush(ctx))
	}
	return errors.Join(errs...)
}

// close closes the clients of cells with their own brokers (Run closes
// the default one).
func (c *cellRouter) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cl := range c.clients {
		cl.Close()
	}
}

func header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return nil
}

// place sets r's topic to its cell's and returns the client to produce it
// with, moving the endpoint first when its cell changed. ok is false for a
// record whose model has no cell (counted as lost, logged) or when the
// move could not be produced (a fatal produce error, set).
func (c *cellRouter) place(ctx context.Context, r *kgo.Record) (*kgo.Client, bool) {
	model, pod, rank := string(header(r, contract.HeaderModel)), string(r.Key), string(header(r, contract.HeaderDPRank))
	key := pod + "\x00" + rank
	cell, err := c.src.Current().WriteCell(model, pod)
	if err != nil {
		prev, known := c.at[key]
		if !known {
			c.b.m.lost.WithLabelValues(lostNoCell).Inc()
			c.b.log.Warn("record skipped: the cell map has no cell for its model", "model", model, "pod", pod, "err", err)
			return nil, false
		}
		// The model left the map: stay where it was until it names a cell.
		cell = prev
	}
	prev, known := c.at[key]
	if known && (prev.Name != cell.Name || prev.Topic != cell.Topic) {
		if err := c.move(ctx, r, prev, cell); err != nil {
			c.b.setFatal(fmt.Errorf("%w: moving pod %s from cell %s to %s: %v", ErrProduce, pod, prev.Name, cell.Name, err))
			return nil, false
		}
	}
	cl, err := c.client(cell)
	if err != nil {
		c.b.setFatal(err)
		return nil, false
	}
	if recordKind(r) == contract.KindGoodbye {
		delete(c.at, key)
	} else {
		c.at[key] = cell
	}
	r.Topic = cell.Topic
	return cl, true
}

// move finishes what was produced, drops the endpoint of r in from and
// starts it fresh in to.
func (c *cellRouter) move(ctx context.Context, r *kgo.Record, from, to cellmap.Cell) error {
	ctx, cancel := context.WithTimeout(ctx, c.b.cfg.FlushTimeout)
	defer cancel()
	if err := c.flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	control := func(kind string, cell cellmap.Cell) error {
		cl, err := c.client(cell)
		if err != nil {
			return err
		}
		rec := &kgo.Record{Topic: cell.Topic, Key: r.Key, Headers: []kgo.RecordHeader{
			{Key: contract.HeaderModel, Value: header(r, contract.HeaderModel)},
			{Key: contract.HeaderDPRank, Value: header(r, contract.HeaderDPRank)},
			{Key: contract.HeaderKind, Value: []byte(kind)},
		}}
		if err := c.b.produceBounded(ctx, cl, rec); err != nil {
			return fmt.Errorf("%s in cell %s: %w", kind, cell.Name, err)
		}
		c.b.m.produced.WithLabelValues(kind).Inc()
		return nil
	}
	if err := control(contract.KindGoodbye, from); err != nil {
		return err
	}
	if err := control(contract.KindResync, to); err != nil {
		return err
	}
	c.b.m.cellMoves.Inc()
	c.b.log.Info("endpoint moved to another cell", "pod", string(r.Key), "dp_rank", string(header(r, contract.HeaderDPRank)),
		"from", from.Name, "to", to.Name)
	return nil
}

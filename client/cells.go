package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvindex/kvindex/client/cellmap"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// CellSource supplies the cell map a cell-mode client routes by: a
// *cellmap.Map (a fixed map) or a *cellmap.Watcher (a watched file, whose
// Run the caller owns). Current is called once per call and must be safe
// for concurrent use and never return nil once New succeeded.
type CellSource interface {
	Current() *cellmap.Map
}

// WithCells makes the client serve a cell map instead of one target (pass
// "" as New's target): each call resolves its model to cells through
// src.Current() at the time of the call. See the package doc's "Cells".
func WithCells(src CellSource) Option {
	return func(o *options) { o.cells, o.cellsGiven = src, true }
}

// CellAnswer is one cell's share of a cell-mode Lookup answer.
type CellAnswer struct {
	Cell           string
	Revision       int64
	AppliedOffsets []PartitionOffset
	ProgressTime   time.Time
}

// CellError is a cell that did not answer a cell-mode call. Err wraps the
// sentinels of errors.go like any call's error.
type CellError struct {
	Cell string
	Err  error
}

// cellSet is a cell-mode client's connections, one Client per (cell name,
// indexd target) ever routed to. Connections of cells that leave the map
// are kept until Close (maps change rarely; a call in flight on one is
// never cut).
type cellSet struct {
	src  CellSource
	opts []Option

	mu     sync.Mutex
	conns  map[string]*Client // by name + "\x00" + target; guarded by mu
	closed bool               // guarded by mu
	// failed holds, by the same key, a connection New refused and when,
	// so a cell whose target or TLS files are wrong costs one New (and
	// one read of its files) per cellRetryAfter, not one per call.
	failed map[string]cellFailure // guarded by mu
}

// cellFailure is a cell connection New refused at at.
type cellFailure struct {
	err error
	at  time.Time
}

// cellRetryAfter is how long a cell connection New refused is not tried
// again: the cell map's re-read interval, so a fixed map (or fixed files)
// is picked up about as fast.
const cellRetryAfter = time.Second

// client returns the connection of cell, making it on first use.
func (s *cellSet) client(cell cellmap.Cell) (*Client, error) {
	key := cell.Name + "\x00" + cell.Indexd
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if c := s.conns[key]; c != nil {
		return c, nil
	}
	if f, ok := s.failed[key]; ok && time.Since(f.at) < cellRetryAfter {
		return nil, f.err
	}
	c, err := New(cell.Indexd, append(slices.Clone(s.opts), func(o *options) { o.cells, o.cellsGiven = nil, false })...)
	if err != nil {
		// A target or TLS setting New refuses is the configuration's
		// fault, not an outage: an *Error with its code, so that a call
		// no cell answered reports it as such (allFailed).
		code := codes.Unavailable
		if errors.Is(err, ErrInvalidArgument) {
			code = codes.InvalidArgument
		}
		err = callError("New", status.Errorf(code, "connecting to cell %s at %q: %v", cell.Name, cell.Indexd, err))
		if s.failed == nil {
			s.failed = map[string]cellFailure{}
		}
		s.failed[key] = cellFailure{err: err, at: time.Now()}
		return nil, err
	}
	delete(s.failed, key)
	s.conns[key] = c
	return c, nil
}

func (s *cellSet) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for _, c := range s.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// route resolves model in the current map; an unmapped model is the
// caller's error.
func (s *cellSet) route(method, model string) (*cellmap.Map, cellmap.Route, error) {
	m := s.src.Current()
	r, err := m.Route(model)
	if err != nil {
		return nil, r, invalidArgument(method, "%v", err)
	}
	return m, r, nil
}

type cellResult struct {
	res *LookupResult
	err error
}

// lookup sends a complete request to every cell the model is read from,
// in parallel, and merges the answers (see LookupResult's cell fields).
// It fails only when no cell answered, with the first cell's error
// naming every cell's.
func (s *cellSet) lookup(ctx context.Context, req *kvindexv1.LookupRequest) (*LookupResult, error) {
	m, route, err := s.route("Lookup", req.Model)
	if err != nil {
		return nil, err
	}
	results := make([]cellResult, len(route.Read))
	one := func(i int, r *kvindexv1.LookupRequest) {
		cell, _ := m.Cell(route.Read[i]) // Parse checked every name
		c, err := s.client(cell)
		if err != nil {
			results[i].err = err
			return
		}
		res, err := c.send(ctx, forCell(r, cell.Topic))
		if err == nil && len(route.Read) > 1 && c.staleAfter > 0 && !res.ProgressTime.IsZero() {
			if age := c.now().Sub(res.ProgressTime); age > c.staleAfter {
				res, err = nil, &Error{Method: "Lookup", Code: codes.Unavailable, sentinel: ErrUnavailable,
					Message: fmt.Sprintf("cell %s answered from an index %v old (its etcd is out of reach): counted as not answering", cell.Name, age.Round(time.Millisecond))}
			}
		}
		results[i].res, results[i].err = res, err
	}
	if len(route.Read) == 1 {
		one(0, req)
	} else {
		var wg sync.WaitGroup
		for i := range route.Read {
			wg.Add(1)
			go func() {
				defer wg.Done()
				one(i, proto.Clone(req).(*kvindexv1.LookupRequest))
			}()
		}
		wg.Wait()
	}
	return merge(route, results)
}

// forCell keeps only the barrier records of the cell's topic (another
// cell's indexd never applies them, so it would wait out the barrier);
// a barrier left empty is dropped. It edits r, which is the cell's own
// copy.
func forCell(r *kvindexv1.LookupRequest, topic string) *kvindexv1.LookupRequest {
	if r.Barrier == nil {
		return r
	}
	recs := r.Barrier.Records[:0:0]
	for _, rec := range r.Barrier.Records {
		if rec.Topic == topic {
			recs = append(recs, rec)
		}
	}
	if len(recs) == 0 {
		r.Barrier = nil
	} else {
		r.Barrier = &kvindexv1.Barrier{Timeout: r.Barrier.Timeout, Records: recs}
	}
	return r
}

// merge unions the cells' matches (every endpoint lives in one cell; a
// copy in a second cell, while a model moves, loses to the copy of the
// pod's write cell) and orders them as one replica would.
func merge(route cellmap.Route, results []cellResult) (*LookupResult, error) {
	out := &LookupResult{}
	at := map[Endpoint]int{}
	zeroProgress := false
	for i, r := range results {
		name := route.Read[i]
		if r.err != nil {
			out.Failed = append(out.Failed, CellError{Cell: name, Err: r.err})
			continue
		}
		out.Cells = append(out.Cells, CellAnswer{Cell: name, Revision: r.res.Revision, AppliedOffsets: r.res.AppliedOffsets, ProgressTime: r.res.ProgressTime})
		out.AppliedOffsets = append(out.AppliedOffsets, r.res.AppliedOffsets...)
		switch {
		case r.res.ProgressTime.IsZero():
			zeroProgress = true
		case out.ProgressTime.IsZero() || r.res.ProgressTime.Before(out.ProgressTime):
			out.ProgressTime = r.res.ProgressTime
		}
		for _, mt := range r.res.Matches {
			j, dup := at[mt.Endpoint]
			if !dup {
				at[mt.Endpoint] = len(out.Matches)
				out.Matches = append(out.Matches, mt)
				continue
			}
			out.Duplicates++
			if cellmap.PodCell(route.Write, mt.Endpoint.Pod) == name {
				out.Matches[j] = mt
			}
		}
	}
	if len(out.Cells) == 0 {
		return nil, allFailed("Lookup", out.Failed)
	}
	if zeroProgress {
		out.ProgressTime = time.Time{}
	}
	if len(out.Cells) == 1 {
		out.Revision = out.Cells[0].Revision
	}
	slices.SortFunc(out.Matches, func(a, b Match) int {
		return cmp.Or(cmp.Compare(b.Blocks, a.Blocks), strings.Compare(a.Endpoint.Pod, b.Endpoint.Pod), cmp.Compare(a.Endpoint.DPRank, b.Endpoint.DPRank))
	})
	return out, nil
}

// allFailed is the error of a cell-mode call no cell answered: the first
// cell's code and sentinel, with every cell's error in the message.
func allFailed(method string, failed []CellError) error {
	var msgs []string
	for _, f := range failed {
		msgs = append(msgs, fmt.Sprintf("cell %s: %v", f.Cell, f.Err))
	}
	e := &Error{Method: method, Code: codes.Unavailable, Message: "no cell answered: " + strings.Join(msgs, "; "), sentinel: ErrUnavailable}
	var first *Error
	if errors.As(failed[0].Err, &first) {
		e.Code, e.sentinel = first.Code, first.sentinel
	} else if errors.Is(failed[0].Err, ErrClosed) {
		e.sentinel = ErrClosed
	}
	return e
}

// listCells are the cells a listing of model walks: the model's read
// cells, or every cell for "".
func (s *cellSet) listCells(model string) (*cellmap.Map, []string, error) {
	if model == "" {
		m := s.src.Current()
		var names []string
		for _, c := range m.Cells() {
			names = append(names, c.Name)
		}
		return m, names, nil
	}
	m, r, err := s.route("ListEndpoints", model)
	return m, r.Read, err
}

// listEndpoints walks every cell's pages (each cell's own ListEndpoints)
// and merges them ordered by model, pod, rank, cell. A cell that fails
// fails the list (an operator view must not look complete when it is
// not). Revision and MaxRevision are the one cell's when the list has
// one cell, else 0: revisions of two etcd clusters do not compare.
func (s *cellSet) listEndpoints(ctx context.Context, model string) (*EndpointList, error) {
	m, names, err := s.listCells(model)
	if err != nil {
		return nil, err
	}
	out := &EndpointList{}
	for _, name := range names {
		cell, _ := m.Cell(name)
		c, err := s.client(cell)
		if err != nil {
			return nil, err
		}
		l, err := c.ListEndpoints(ctx, model)
		if err != nil {
			return nil, cellErr(name, err)
		}
		for _, e := range l.Endpoints {
			e.Cell = name
			out.Endpoints = append(out.Endpoints, e)
		}
		out.Pages += l.Pages
		if len(names) == 1 {
			out.Revision, out.MaxRevision = l.Revision, l.MaxRevision
		}
	}
	slices.SortStableFunc(out.Endpoints, func(a, b EndpointInfo) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Endpoint.Pod, b.Endpoint.Pod),
			cmp.Compare(a.Endpoint.DPRank, b.Endpoint.DPRank), strings.Compare(a.Cell, b.Cell))
	})
	return out, nil
}

// cellErr names the cell in a call's error, keeping its code and
// sentinel.
func cellErr(cell string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return &Error{Method: e.Method, Code: e.Code, Message: "cell " + cell + ": " + e.Message, sentinel: e.sentinel}
	}
	return fmt.Errorf("cell %s: %w", cell, err)
}

// cellTokenPrefix marks a cell-mode page token: "kvcells1:" + the cell's
// name + ":" + that cell's own page token.
const cellTokenPrefix = "kvcells1:"

// listEndpointsPage serves one page of one cell: cells in map order, each
// paged through to its end before the next starts (so a cell-mode page
// list is ordered by cell, then model, pod, rank; ListEndpoints sorts the
// whole).
func (s *cellSet) listEndpointsPage(ctx context.Context, model string, pageSize int, pageToken string) (*EndpointPage, error) {
	m, names, err := s.listCells(model)
	if err != nil {
		return nil, err
	}
	i, inner := 0, ""
	if pageToken != "" {
		rest, ok := strings.CutPrefix(pageToken, cellTokenPrefix)
		name, tok, ok2 := strings.Cut(rest, ":")
		i = slices.Index(names, name)
		if !ok || !ok2 || i < 0 {
			return nil, invalidArgument("ListEndpoints", "page token %q is not one this cell map issued", pageToken)
		}
		inner = tok
	}
	if len(names) == 0 {
		return &EndpointPage{}, nil
	}
	cell, _ := m.Cell(names[i])
	c, err := s.client(cell)
	if err != nil {
		return nil, err
	}
	page, err := c.ListEndpointsPage(ctx, model, pageSize, inner)
	if err != nil {
		return nil, cellErr(cell.Name, err)
	}
	for j := range page.Endpoints {
		page.Endpoints[j].Cell = cell.Name
	}
	switch {
	case page.NextPageToken != "":
		page.NextPageToken = cellTokenPrefix + cell.Name + ":" + page.NextPageToken
	case i+1 < len(names):
		page.NextPageToken = cellTokenPrefix + names[i+1] + ":"
	}
	return page, nil
}

package gie

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/client/cellmap"
)

// IndexError is a failed Lookup, classified for the metrics: Kind is one
// of the Kind* constants.
type IndexError struct {
	Kind string
	Err  error
}

// Error names the kind and the client's error.
func (e *IndexError) Error() string { return "kvindex lookup (" + e.Kind + "): " + e.Err.Error() }

// Unwrap returns the client's error.
func (e *IndexError) Unwrap() error { return e.Err }

// KVIndex is the Index of kvindex's Go client: a token-mode Lookup with
// the candidates as the filter. It is safe for concurrent use; Close
// releases its connections and, with a cell map file, stops its watcher
// and waits for it.
type KVIndex struct {
	c *client.Client
	// onPartial, when set, is called for each cell-mode answer some cell
	// did not give (the producer counts it as a fallback).
	onPartial func(ctx context.Context, failed []client.CellError)
	// stopWatch stops the cell map watcher (nil without one) and waits.
	stopWatch func()
}

var _ Index = (*KVIndex)(nil)

// DialKVIndex returns a KVIndex for params' target and TLS settings,
// given to the client module as its own TLS options (WithTLSCAFile,
// WithTLSCertFiles, WithTLSServerName): the client reads the CA and the
// key pair, and re-reads a rotated client certificate on new
// connections. Like client.New it does not connect; the first Lookup
// does. It errors (ErrInvalidConfig) for an empty target or unreadable
// TLS files.
func DialKVIndex(params ProducerParams) (*KVIndex, error) {
	opts := clientOptions(params)
	if params.CellMap != "" {
		return dialCells(params.CellMap, opts)
	}
	c, err := client.New(params.Target, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	return &KVIndex{c: c}, nil
}

// dialCells builds a cell-mode client from an inline map (a JSON object)
// or a map file, whose watcher runs until Close.
func dialCells(cellMap string, opts []client.Option) (*KVIndex, error) {
	if strings.HasPrefix(strings.TrimSpace(cellMap), "{") {
		m, err := cellmap.Parse([]byte(cellMap))
		if err != nil {
			return nil, fmt.Errorf("%w: cellMap: %v", ErrInvalidConfig, err)
		}
		c, err := client.New("", append(opts, client.WithCells(m))...)
		if err != nil {
			return nil, fmt.Errorf("%w: cellMap: %v", ErrInvalidConfig, err)
		}
		return &KVIndex{c: c}, nil
	}
	w, err := cellmap.NewWatcher(cellmap.WatcherConfig{Path: cellMap})
	if err != nil {
		return nil, fmt.Errorf("%w: cellMap: %v", ErrInvalidConfig, err)
	}
	c, err := client.New("", append(opts, client.WithCells(w))...)
	if err != nil {
		return nil, fmt.Errorf("%w: cellMap: %v", ErrInvalidConfig, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx) // returns nil when ctx ends
	}()
	var once sync.Once
	return &KVIndex{c: c, stopWatch: func() { once.Do(func() { cancel(); <-done }) }}, nil
}

// clientOptions maps the producer's parameters to the client's options.
func clientOptions(params ProducerParams) []client.Option {
	opts := []client.Option{client.WithTimeout(time.Duration(params.LookupTimeout))}
	if params.CAFile != "" {
		opts = append(opts, client.WithTLSCAFile(params.CAFile))
	}
	if params.CertFile != "" || params.KeyFile != "" {
		opts = append(opts, client.WithTLSCertFiles(params.CertFile, params.KeyFile))
	}
	if params.ServerName != "" {
		opts = append(opts, client.WithTLSServerName(params.ServerName))
	}
	return opts
}

// Close stops the cell map watcher, if any, and closes the client.
func (k *KVIndex) Close() error {
	if k.stopWatch != nil {
		k.stopWatch()
	}
	return k.c.Close()
}

// IndexedEndpoints implements EndpointLister: at most limit endpoints of
// model, walking ListEndpointsPage pages (at most indexedPagesMax of
// them) until it has limit or the last page. In cell mode the pages go
// cell by cell, and a cell that holds none of the model's endpoints (a
// model moving to a new cell, one read first while still empty) gives an
// empty page that points at the next cell, so the walk must go on past
// it. Errors are *IndexError.
func (k *KVIndex) IndexedEndpoints(ctx context.Context, model string, limit int) ([]Identity, error) {
	limit = max(limit, 1)
	var out []Identity
	token := ""
	for range indexedPagesMax {
		page, err := k.c.ListEndpointsPage(ctx, model, limit-len(out), token)
		if err != nil {
			return nil, &IndexError{Kind: clientErrorKind(err), Err: err}
		}
		for _, e := range page.Endpoints {
			out = append(out, Identity{Pod: e.Endpoint.Pod, Rank: e.Endpoint.DPRank})
		}
		if len(out) >= limit || page.NextPageToken == "" || page.NextPageToken == token {
			break
		}
		token = page.NextPageToken
	}
	return out, nil
}

// indexedPagesMax bounds the pages one IndexedEndpoints call reads (each
// one call, all within its context): enough for a model spread over many
// cells, few enough that a server handing out pages without end cannot
// hold a check for long.
const indexedPagesMax = 64

// LookupTokens implements Index with client.LookupTokens. Errors are
// *IndexError.
func (k *KVIndex) LookupTokens(ctx context.Context, model string, p Prompt, candidates []Identity) (IndexAnswer, error) {
	tp := client.TokenPrompt{TokenIDs: p.TokenIDs, LoRAName: p.LoRAName, CacheSalt: p.CacheSalt}
	for _, mm := range p.MultiModal {
		tp.MultiModal = append(tp.MultiModal, client.MultiModalItem{Hash: mm.Hash, Offset: mm.Offset, Length: mm.Length})
	}
	var opts []client.LookupOption
	if len(candidates) > 0 {
		eps := make([]client.Endpoint, len(candidates))
		for i, c := range candidates {
			eps[i] = client.Endpoint{Pod: c.Pod, DPRank: c.Rank}
		}
		opts = append(opts, client.WithCandidates(eps...))
	}
	res, err := k.c.LookupTokens(ctx, model, tp, opts...)
	if err != nil {
		return IndexAnswer{}, &IndexError{Kind: clientErrorKind(err), Err: err}
	}
	if res.Partial() && k.onPartial != nil {
		k.onPartial(ctx, res.Failed)
	}
	out := make([]IndexMatch, len(res.Matches))
	for i, m := range res.Matches {
		tiers := make([]Tier, len(m.Tiers))
		for j, t := range m.Tiers {
			tiers[j] = Tier(t)
		}
		out[i] = IndexMatch{
			Identity:  Identity{Pod: m.Endpoint.Pod, Rank: m.Endpoint.DPRank},
			Blocks:    m.Blocks,
			BlockSize: m.BlockSize,
			Tiers:     tiers,
		}
	}
	ans := IndexAnswer{Matches: out, ProgressTime: res.ProgressTime}
	if res.Partial() {
		// The progress time is the answering cells' own: it says nothing
		// of the endpoints of the cells that failed, so a speculative
		// entry for one of them must not be dropped by it (their TTL
		// still ends them).
		ans.ProgressTime = time.Time{}
	}
	return ans, nil
}

// clientErrorKind maps the client's sentinels to metric kinds.
func clientErrorKind(err error) string {
	switch {
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, client.ErrClosed):
		return KindUnavailable
	case errors.Is(err, client.ErrDeadlineExceeded), errors.Is(err, client.ErrCanceled),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return KindDeadline
	case errors.Is(err, client.ErrInvalidArgument), errors.Is(err, client.ErrResourceExhausted):
		return KindInvalid
	}
	return KindOther
}

package cellmap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is how often a Watcher re-reads its file by default.
// The kubelet refreshes a ConfigMap volume within about a minute; a
// second's poll of a small file costs nothing next to that.
const DefaultInterval = time.Second

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Path is the cell map file. Required. Symlinks are followed on every
	// read, so a ConfigMap volume's "..data" swap is seen.
	Path string
	// Interval is the re-read period. Default DefaultInterval; zero means
	// the default, negative is an error.
	Interval time.Duration
	// Logger logs reloads and refused files. Default: none.
	Logger *slog.Logger
}

// Validate reports a missing path or a negative interval.
func (c WatcherConfig) Validate() error {
	switch {
	case c.Path == "":
		return errors.New("cellmap: watcher: path is required")
	case c.Interval < 0:
		return fmt.Errorf("cellmap: watcher: interval %v is negative", c.Interval)
	}
	return nil
}

// Watcher holds the current cell map of a file and reloads it on change.
// NewWatcher loads the file once; Run keeps it current until its context
// ends. Current and Changed are safe for concurrent use, before and during
// Run.
type Watcher struct {
	cfg     WatcherConfig
	log     *slog.Logger
	cur     atomic.Pointer[Map]
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on each swap; guarded by mu
	raw     []byte        // the last bytes read (good or bad); Run's only
	reloads atomic.Uint64
	refused atomic.Uint64
	lastErr atomic.Pointer[error]
	started atomic.Bool
}

// NewWatcher validates cfg and loads the file, erroring (ErrInvalid, or
// the read error) when it is not a valid map: a process must not start
// on a bad map.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	data, err := readFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	w := &Watcher{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}), raw: data}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.cur.Store(m)
	return w, nil
}

// Current returns the map in force.
func (w *Watcher) Current() *Map { return w.cur.Load() }

// Changed returns a channel closed when the map Current returns next is
// replaced. Take it before reading Current to miss no change.
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// Stats returns how many times the map was replaced and how many changed
// files were refused (unreadable or invalid), and the last refusal's
// error (nil when the file in force is the last one read).
func (w *Watcher) Stats() (reloads, refused uint64, lastErr error) {
	if p := w.lastErr.Load(); p != nil {
		lastErr = *p
	}
	return w.reloads.Load(), w.refused.Load(), lastErr
}

// Run re-reads the file every interval until ctx ends, then returns nil.
// A changed file that parses replaces the map; one that does not is
// logged, counted (Stats) and ignored until it changes again. Run may be
// called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("cellmap: watcher: Run called twice")
	}
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.Reload()
	}
}

// Reload reads the file now, as Run does each interval, and reports
// whether the map changed. Run calls it; tests and operators' tools may
// call it when Run is not running (it must not be called concurrently with
// itself).
func (w *Watcher) Reload() bool {
	data, err := readFile(w.cfg.Path)
	if err == nil && bytes.Equal(data, w.raw) {
		return false
	}
	var m *Map
	if err == nil {
		w.raw = data
		m, err = Parse(data)
	}
	if err != nil {
		// An unreadable file is retried each interval (w.raw unchanged);
		// an invalid one is reported once per change.
		w.refused.Add(1)
		w.lastErr.Store(&err)
		w.log.Warn("cell map refused; keeping the last good one", "path", w.cfg.Path, "err", err)
		return false
	}
	w.lastErr.Store(nil)
	if m.Equal(w.cur.Load()) {
		return false
	}
	w.mu.Lock()
	w.cur.Store(m)
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
	w.reloads.Add(1)
	w.log.Info("cell map reloaded", "path", w.cfg.Path, "cells", len(m.file.Cells), "rules", len(m.file.Models))
	return true
}

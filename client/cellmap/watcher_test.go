package cellmap

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mapDoc(model, cell string) string {
	return `{"cells": [{"name": "a", "indexd": "x:1", "topic": "ta"}, {"name": "b", "indexd": "x:2", "topic": "tb"}],
 "models": [{"match": "` + model + `", "cells": ["` + cell + `"]}]}`
}

// writeConfigMap writes doc the way the kubelet updates a ConfigMap
// volume: a new timestamped directory, then an atomic rename of the
// "..data" symlink; the file itself is a symlink into ..data.
func writeConfigMap(t *testing.T, dir, doc string, n int) {
	t.Helper()
	ts := filepath.Join(dir, "..v"+strings.Repeat("x", n))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "cells.json"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if n == 1 {
		if err := os.Symlink(filepath.Join("..data", "cells.json"), filepath.Join(dir, "cells.json")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatcherReload(t *testing.T) {
	dir := t.TempDir()
	writeConfigMap(t, dir, mapDoc("m", "a"), 1)
	path := filepath.Join(dir, "cells.json")
	if _, err := NewWatcher(WatcherConfig{Path: filepath.Join(dir, "missing.json")}); err == nil {
		t.Fatal("NewWatcher of a missing file: no error")
	}
	w, err := NewWatcher(WatcherConfig{Path: path, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cellOf := func() string {
		c, err := w.Current().WriteCell("m", "pod")
		if err != nil {
			t.Fatal(err)
		}
		return c.Name
	}
	if got := cellOf(); got != "a" {
		t.Fatalf("initial map: m in %s, want a", got)
	}

	// Reload by hand: an unchanged file, a symlink swap, a bad file.
	if w.Reload() {
		t.Fatal("Reload of an unchanged file reported a change")
	}
	changed := w.Changed()
	writeConfigMap(t, dir, mapDoc("m", "b"), 2)
	if !w.Reload() {
		t.Fatal("Reload after a ..data swap saw no change")
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed channel not closed by a reload")
	}
	if got := cellOf(); got != "b" {
		t.Fatalf("after the swap: m in %s, want b", got)
	}
	writeConfigMap(t, dir, mapDoc("m", "nosuch"), 3)
	if w.Reload() {
		t.Fatal("Reload of an invalid map reported a change")
	}
	if got := cellOf(); got != "b" {
		t.Fatalf("after an invalid map: m in %s, want b kept", got)
	}
	if reloads, refused, lastErr := w.Stats(); reloads != 1 || refused != 1 || lastErr == nil {
		t.Fatalf("Stats = %d, %d, %v; want 1 reload, 1 refusal with its error", reloads, refused, lastErr)
	}

	// Run picks up a change by itself, and stops with its context.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := w.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	changed = w.Changed()
	writeConfigMap(t, dir, mapDoc("m", "a"), 4)
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not reload a changed file")
	}
	if got := cellOf(); got != "a" {
		t.Fatalf("after Run's reload: m in %s, want a", got)
	}
	if _, _, lastErr := w.Stats(); lastErr != nil {
		t.Fatalf("last error %v after a good map", lastErr)
	}
}

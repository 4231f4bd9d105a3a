package lookupcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEndpointsCommandCellMap: with --cell-map, endpoints lists every
// cell's endpoints (two cells served by the same test index here, so each
// endpoint is listed once per cell), and a bad map is a usage error.
func TestEndpointsCommandCellMap(t *testing.T) {
	addr := startIndex(t)
	path := filepath.Join(t.TempDir(), "cells.json")
	doc := fmt.Sprintf(`{"cells": [{"name": "a", "indexd": %q, "topic": "ta"}, {"name": "b", "indexd": %q, "topic": "tb"}], "default": "a"}`, addr, addr)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, NewEndpointsCommand, "--cell-map", path)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "4 endpoints") {
		t.Fatalf("endpoints across two cells: want 4 endpoints (2 per cell):\n%s", out)
	}
	if err := os.WriteFile(path, []byte(`{"cells": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, NewEndpointsCommand, "--cell-map", path); err == nil || !strings.Contains(err.Error(), "--cell-map") {
		t.Fatalf("a bad cell map: %v, want an error naming --cell-map", err)
	}
}

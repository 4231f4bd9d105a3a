package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/sim/fleetsim"
)

// BundledTrace is the repository path of the bundled Mooncake conversation
// trace (a copy of ../shared/data/mooncake/conversation_trace.jsonl).
const BundledTrace = "testdata/mooncake/conversation_trace.jsonl"

// modulePath is the module whose root holds BundledTrace.
const modulePath = "github.com/kvindex/kvindex"

// ErrNoTrace reports that no trace path was given and the bundled trace
// was not found above the working directory.
var ErrNoTrace = errors.New("bench: no trace file")

// DefaultTracePath finds the bundled trace: BundledTrace under the first
// directory, from the working directory upwards, whose go.mod declares
// this module (so it works anywhere inside a clone). It fails with
// ErrNoTrace outside a clone.
func DefaultTracePath() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoTrace, err)
	}
	for {
		if isModuleRoot(filepath.Join(dir, "go.mod")) {
			p := filepath.Join(dir, filepath.FromSlash(BundledTrace))
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("%w: %v", ErrNoTrace, err)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%w: %s not found above the working directory (run inside a clone of %s, or pass --trace)", ErrNoTrace, BundledTrace, modulePath)
		}
		dir = parent
	}
}

// isModuleRoot reports whether the go.mod at path declares modulePath.
func isModuleRoot(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == modulePath
		}
	}
	return false
}

// LoadTrace reads the trace at path, or the bundled one when path is
// empty.
func LoadTrace(path string) ([]fleetsim.Request, error) {
	if path == "" {
		var err error
		if path, err = DefaultTracePath(); err != nil {
			return nil, err
		}
	}
	return fleetsim.LoadTrace(path)
}

// Model is the model name every benchmark workload is published under.
const Model = "bench/mooncake"

// TraceEntries enumerates (block, endpoint, GPU) entries of salted copies
// of a trace, the contents an index holds for a fleet that served the
// trace Copies times over with caches that never evict: copy c's request
// i goes to endpoint i mod Endpoints (round-robin, as fleetsim routes) and
// its hash ids become block hashes under salt c (fleetsim.BlockHash), so
// copies share no block while a copy keeps the trace's prefix sharing
// (blocks of a shared prefix sit on several endpoints). Each (endpoint,
// block) is produced once.
type TraceEntries struct {
	Trace     []fleetsim.Request
	Endpoints int
	// Pods names the endpoints (model Model, rank 0).
	Pods []keyspace.Endpoint
}

// NewTraceEntries returns the entries of trace over endpoints endpoints
// named like fleetsim's pods ("sim-00", ...). It fails for an empty trace
// or fewer than one endpoint.
func NewTraceEntries(trace []fleetsim.Request, endpoints int) (*TraceEntries, error) {
	if len(trace) == 0 || endpoints < 1 {
		return nil, fmt.Errorf("bench: trace entries need requests (%d) and endpoints (%d)", len(trace), endpoints)
	}
	t := &TraceEntries{Trace: trace, Endpoints: endpoints}
	for i := range endpoints {
		t.Pods = append(t.Pods, keyspace.Endpoint{Model: Model, Pod: fmt.Sprintf("sim-%02d", i)})
	}
	return t, nil
}

// Coverage says which requests' entries Each produced in full: every
// request of the first Complete copies, and of copy Complete the requests
// listed in Partial.
type Coverage struct {
	Complete int
	Partial  []int
}

// Each calls put with each new entry, copy after copy, until put returns
// false or n entries were produced, and returns which requests it covered.
func (t *TraceEntries) Each(n int, put func(ep keyspace.Endpoint, hash uint64) bool) Coverage {
	var cov Coverage
	produced := 0
	for c := 0; ; c++ {
		seen := make([]map[uint64]struct{}, t.Endpoints)
		for i := range seen {
			seen[i] = make(map[uint64]struct{})
		}
		cov.Partial = cov.Partial[:0]
		for i, r := range t.Trace {
			e := i % t.Endpoints
			for _, id := range r.HashIDs {
				h := fleetsim.BlockHash(uint64(c), id)
				if _, dup := seen[e][h]; dup {
					continue
				}
				if produced == n || !put(t.Pods[e], h) {
					return cov
				}
				seen[e][h] = struct{}{}
				produced++
			}
			cov.Partial = append(cov.Partial, i)
		}
		cov.Complete++
	}
}

// Queries returns one query per trace request, each the request's block
// hashes under the salt of a copy cov says is complete (request i asks
// copy i mod cov.Complete), so every query's prompt is held in full by the
// endpoint that served it. With no complete copy, only the requests of
// cov.Partial are asked.
func (t *TraceEntries) Queries(cov Coverage) [][]uint64 {
	hashes := func(c, i int) []uint64 {
		ids := t.Trace[i].HashIDs
		hs := make([]uint64, len(ids))
		for k, id := range ids {
			hs[k] = fleetsim.BlockHash(uint64(c), id)
		}
		return hs
	}
	var out [][]uint64
	if cov.Complete == 0 {
		for _, i := range cov.Partial {
			out = append(out, hashes(0, i))
		}
		return out
	}
	for i := range t.Trace {
		out = append(out, hashes(i%cov.Complete, i))
	}
	return out
}

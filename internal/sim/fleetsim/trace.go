// Package fleetsim simulates a fleet of model-server endpoints serving a
// request trace, and emits the KV events their prefix caches would publish.
// It drives kvindex's benchmarks and load tests with a real prefix-sharing
// pattern: the Mooncake traces bundled under testdata/mooncake, where each
// request lists its prefix blocks as hash ids and equal ids mark reusable
// blocks.
//
// Each endpoint keeps an LRU GPU cache of Config.GPUBlocks blocks with an
// LRU CPU tier of Config.CPUBlocks behind it, as vLLM does with CPU
// offloading: a block evicted from the GPU is removed there and stored in the
// CPU tier (an offload placeholder: no tokens, block size 0); a CPU hit is
// loaded back into the GPU. Requests are routed round-robin.
//
// Not production code (internal/sim): only the `kvindex-bench` workloads
// and tests use it.
package fleetsim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// Request is one trace request.
type Request struct {
	// Arrival is the request's arrival time from the trace start.
	Arrival time.Duration
	// InputLength is the prompt length in tokens.
	InputLength int
	// HashIDs are the prompt's prefix blocks, first block first (trace ids,
	// not block hashes: BlockHash maps them).
	HashIDs []uint64
}

type traceLine struct {
	Timestamp   int64    `json:"timestamp"`
	InputLength int      `json:"input_length"`
	HashIDs     []uint64 `json:"hash_ids"`
}

// LoadTrace reads a Mooncake trace file (JSON lines with timestamp in ms,
// input_length and hash_ids).
func LoadTrace(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: %w", err)
	}
	defer f.Close()
	reqs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("fleetsim: %s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace reads a Mooncake trace from r.
func ReadTrace(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var out []Request
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l traceLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, Request{Arrival: time.Duration(l.Timestamp) * time.Millisecond, InputLength: l.InputLength, HashIDs: l.HashIDs})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty trace")
	}
	return out, nil
}

// BlockHash maps a trace hash id to the 64-bit block hash endpoints publish
// and routers look up. salt separates copies of a trace (see Config.Salt):
// the same id under two salts gives unrelated hashes. It is splitmix64's
// finalizer, a bijection on uint64.
func BlockHash(salt, id uint64) uint64 {
	z := id + salt*0x9e3779b97f4a7c15 + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

package sim

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/zeebo/xxh3"
)

// Request is one request of a trace.
type Request struct {
	// At is the request's arrival, from the trace's start (its timestamp
	// in milliseconds).
	At time.Duration
	// IDs are the trace's hash_ids: one per 512-token block of the
	// prompt, the last one partial.
	IDs []uint64
	// Keys are the chained keys of the full blocks (all but the last id):
	// Keys[i] hashes Keys[i-1] and IDs[i], so a key names a block together
	// with everything before it, as an engine's block hash does. Pods
	// cache blocks by key.
	Keys []uint64
	// LastTokens is the partial last block's token count, in [1, 511]:
	// input_length minus the full blocks' tokens, clamped.
	LastTokens int
}

// Tokens returns the request's prompt length in tokens.
func (r Request) Tokens() int { return len(r.Keys)*BlockTokens + r.LastTokens }

// Trace is a loaded trace.
type Trace struct {
	Requests []Request
	// Skipped counts malformed lines left out; FirstSkip says why the
	// first one was.
	Skipped   int
	FirstSkip string
	// Clamped counts requests whose input_length did not fit their
	// hash_ids (their last block's tokens were clamped into [1, 511]).
	Clamped int
	// UniqueBlocks is the number of distinct full-block keys.
	UniqueBlocks int
	// MaxBlocks is the most full blocks of one request.
	MaxBlocks int
}

// traceLine is one JSON line of a Mooncake trace.
type traceLine struct {
	Timestamp   *float64 `json:"timestamp"`
	InputLength *int     `json:"input_length"`
	HashIDs     []int64  `json:"hash_ids"`
}

// maxTraceLine bounds one line of a trace (a request of 100,000 blocks
// is far past any model's context).
const maxTraceLine = 4 << 20

// ReadTrace reads a Mooncake trace (JSON lines with timestamp in ms,
// input_length and hash_ids), keeping at most limit requests (0: all). A
// malformed line (bad JSON, a missing field, a negative number, no
// hash_ids, a timestamp before the previous line's) is skipped and
// counted, never fatal; reading fails only on an I/O error, a line longer
// than 4 MiB, or when no request is left.
func ReadTrace(r io.Reader, limit int) (*Trace, error) {
	tr := &Trace{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	seen := map[uint64]struct{}{}
	var last time.Duration
	line := 0
	skip := func(why string) {
		tr.Skipped++
		if tr.FirstSkip == "" {
			tr.FirstSkip = fmt.Sprintf("line %d: %s", line, why)
		}
	}
	for sc.Scan() {
		line++
		if limit > 0 && len(tr.Requests) >= limit {
			break
		}
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var tl traceLine
		if err := json.Unmarshal(b, &tl); err != nil {
			skip(err.Error())
			continue
		}
		switch {
		case tl.Timestamp == nil || tl.InputLength == nil:
			skip("timestamp or input_length missing")
			continue
		case *tl.Timestamp < 0 || *tl.InputLength < 0:
			skip("negative timestamp or input_length")
			continue
		case len(tl.HashIDs) == 0:
			skip("no hash_ids")
			continue
		}
		at := time.Duration(*tl.Timestamp * float64(time.Millisecond))
		if at < last {
			skip("timestamp before the previous request's")
			continue
		}
		req := Request{At: at, IDs: make([]uint64, len(tl.HashIDs))}
		bad := false
		for i, id := range tl.HashIDs {
			if id < 0 {
				bad = true
				break
			}
			req.IDs[i] = uint64(id)
		}
		if bad {
			skip("negative hash_id")
			continue
		}
		req.Keys = chainKeys(req.IDs[:len(req.IDs)-1])
		lt := *tl.InputLength - len(req.Keys)*BlockTokens
		if lt < 1 || lt >= BlockTokens {
			tr.Clamped++
			lt = min(max(lt, 1), BlockTokens-1)
		}
		req.LastTokens = lt
		for _, k := range req.Keys {
			seen[k] = struct{}{}
		}
		tr.MaxBlocks = max(tr.MaxBlocks, len(req.Keys))
		last = at
		tr.Requests = append(tr.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the trace (line %d): %w", line+1, err)
	}
	if len(tr.Requests) == 0 {
		if tr.FirstSkip != "" {
			return nil, fmt.Errorf("the trace has no usable request (%d skipped; first: %s)", tr.Skipped, tr.FirstSkip)
		}
		return nil, fmt.Errorf("the trace has no request")
	}
	tr.UniqueBlocks = len(seen)
	return tr, nil
}

// chainKeys returns the chained keys of ids: XXH3 of the previous key and
// the id, little-endian, from the root 0.
func chainKeys(ids []uint64) []uint64 {
	keys := make([]uint64, len(ids))
	var prev uint64
	var b [16]byte
	for i, id := range ids {
		binary.LittleEndian.PutUint64(b[:8], prev)
		binary.LittleEndian.PutUint64(b[8:], id)
		prev = xxh3.Hash(b[:])
		keys[i] = prev
	}
	return keys
}

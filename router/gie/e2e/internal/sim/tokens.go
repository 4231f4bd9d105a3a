package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

const (
	// BlockTokens is the trace's block size: each hash_id is 512 tokens.
	BlockTokens = 512
	// SegmentChars is the prompt text per block id: 2048 characters, 512
	// tokens at the 4 characters a token GIE's approximate producer
	// assumes, so its character blocks line up with the trace's blocks.
	SegmentChars = 4 * BlockTokens
	// Vocab bounds the token ids (a Qwen-sized vocabulary).
	Vocab = 151936
	// segmentHeader is the length of a segment's header,
	// "[<16 hex digits of the id>/<3 digits of the token count>]".
	segmentHeader = 22
)

// mix is SplitMix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// AppendBlockTokens appends the first n (at most BlockTokens) token ids
// of block id to dst. They depend on the id alone: a block id is the same
// 512 tokens in every request and every run.
func AppendBlockTokens(dst []uint32, id uint64, n int) []uint32 {
	s := mix(id ^ 0x6b76696e64657831)
	for i := range min(n, BlockTokens) {
		dst = append(dst, uint32(mix(s+uint64(i)*0x9e3779b97f4a7c15)%Vocab))
	}
	return dst
}

// PromptTokens returns r's token ids: BlockTokens per full block, then
// LastTokens of the last block.
func PromptTokens(r Request) []uint32 {
	out := make([]uint32, 0, r.Tokens())
	for _, id := range r.IDs[:len(r.IDs)-1] {
		out = AppendBlockTokens(out, id, BlockTokens)
	}
	return AppendBlockTokens(out, r.IDs[len(r.IDs)-1], r.LastTokens)
}

// appendSegment appends block id's SegmentChars characters: its header
// (the id and the block's token count n) repeated. A full block (n =
// BlockTokens) has the same text in every request; a partial last block's
// differs, as a partial block's text would.
func appendSegment(dst []byte, id uint64, n int) []byte {
	var h [segmentHeader]byte
	copy(h[:], fmt.Sprintf("[%016x/%03d]", id, n))
	for i := 0; i < SegmentChars; i += segmentHeader {
		dst = append(dst, h[:min(segmentHeader, SegmentChars-i)]...)
	}
	return dst
}

// PromptText returns r's Completions prompt: SegmentChars characters per
// block id.
func PromptText(r Request) string {
	b := make([]byte, 0, len(r.IDs)*SegmentChars)
	for i, id := range r.IDs {
		n := BlockTokens
		if i == len(r.IDs)-1 {
			n = r.LastTokens
		}
		b = appendSegment(b, id, n)
	}
	return string(b)
}

// ParsePrompt maps a prompt made by PromptText back to its token ids (what
// a model server's tokenizer would answer for it).
func ParsePrompt(text string) ([]uint32, error) {
	if len(text) == 0 || len(text)%SegmentChars != 0 {
		return nil, fmt.Errorf("prompt of %d characters is not whole %d-character segments", len(text), SegmentChars)
	}
	out := make([]uint32, 0, len(text)/SegmentChars*BlockTokens)
	for off := 0; off < len(text); off += SegmentChars {
		h := text[off : off+segmentHeader]
		if h[0] != '[' || h[17] != '/' || h[21] != ']' {
			return nil, fmt.Errorf("segment at %d has no header", off)
		}
		id, err := strconv.ParseUint(h[1:17], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("segment at %d: block id: %w", off, err)
		}
		n, err := strconv.Atoi(h[18:21])
		if err != nil || n < 1 || n > BlockTokens {
			return nil, fmt.Errorf("segment at %d: bad token count %q", off, h[18:21])
		}
		out = AppendBlockTokens(out, id, n)
	}
	return out, nil
}

// Tokenizer serves POST /tokenize as vLLM's OpenAI server does
// ({"model", "prompt"} in, {"tokens": [...]} out) for prompts made by
// PromptText. It stands in for the model server the kvindex producer asks
// when a request carries no token ids; the simulator's requests carry
// them (the tokenized-prompt plugin), so it is the fallback, and Calls
// says whether it was ever needed.
type Tokenizer struct {
	// Calls counts the requests served.
	Calls atomic.Int64
	srv   *http.Server
	lis   net.Listener
	done  chan error
}

// StartTokenizer listens on a free loopback port and serves until Close.
func StartTokenizer() (*Tokenizer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t := &Tokenizer{lis: lis, done: make(chan error, 1),
		srv: &http.Server{ReadHeaderTimeout: 5 * time.Second}}
	t.srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Calls.Add(1)
		serveTokenize(w, r)
	})
	go func() { t.done <- t.srv.Serve(lis) }()
	return t, nil
}

// URL returns the tokenize endpoint's URL.
func (t *Tokenizer) URL() string { return "http://" + t.lis.Addr().String() + "/tokenize" }

// Close stops the server (bounded by ctx) and waits for its goroutine.
func (t *Tokenizer) Close(ctx context.Context) error {
	err := t.srv.Shutdown(ctx)
	if serr := <-t.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

func serveTokenize(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var req struct {
		Model  string `json:"model"`
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil || req.Model == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	ids, err := ParsePrompt(req.Prompt)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 262144, "tokens": ids})
}

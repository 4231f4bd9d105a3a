package epptest

import (
	"encoding/json"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Words tokenizes text the way TokenizerServer does: one token per
// whitespace-separated word, its id the word's FNV-1a hash modulo
// 100000. Deterministic, so a test can compute the ids the producer will
// look up and the KV events an engine would publish for them.
func Words(text string) []uint32 {
	f := strings.Fields(text)
	ids := make([]uint32, len(f))
	for i, w := range f {
		h := fnv.New32a()
		_, _ = h.Write([]byte(w))
		ids[i] = h.Sum32() % 100000
	}
	return ids
}

// ChatWords tokenizes chat messages as TokenizerServer does: each
// message is "<role>" followed by its content's words, and
// add_generation_prompt adds "<assistant>".
func ChatWords(messages []map[string]string, addGenerationPrompt bool) []uint32 {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString(" <" + m["role"] + "> " + m["content"])
	}
	if addGenerationPrompt {
		b.WriteString(" <assistant>")
	}
	return Words(b.String())
}

// Tokenizer is a test stand-in for vLLM's POST /tokenize, the only mock
// of these tests (a true edge: the model server). It tokenizes with
// Words and ChatWords.
type Tokenizer struct {
	*httptest.Server
	// Calls counts the requests served.
	Calls atomic.Int64
	// Delay, when set, is how long each answer waits (or until the
	// request is cancelled).
	Delay atomic.Int64
}

// StartTokenizer serves a Tokenizer until t ends.
func StartTokenizer(t testing.TB) *Tokenizer {
	tk := &Tokenizer{}
	tk.Server = httptest.NewServer(http.HandlerFunc(tk.serve))
	t.Cleanup(tk.Close)
	return tk
}

// URL returns the tokenize endpoint's URL.
func (tk *Tokenizer) URL() string { return tk.Server.URL + "/tokenize" }

func (tk *Tokenizer) serve(w http.ResponseWriter, r *http.Request) {
	tk.Calls.Add(1)
	if d := time.Duration(tk.Delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Prompt   string `json:"prompt"`
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
		AddGenerationPrompt *bool `json:"add_generation_prompt"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var ids []uint32
	if req.Messages != nil {
		msgs := make([]map[string]string, len(req.Messages))
		for i, m := range req.Messages {
			s, _ := m.Content.(string)
			msgs[i] = map[string]string{"role": m.Role, "content": s}
		}
		// vLLM's default for /tokenize of messages is true.
		ids = ChatWords(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	} else {
		ids = Words(req.Prompt)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
}

package gie

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// TokenizeRequest is a prompt to tokenize the way the model server will:
// exactly one of Prompt (a completions request) or Chat (a chat
// completions request's fields that shape the templated prompt: messages,
// tools, chat_template, chat_template_kwargs, add_generation_prompt,
// continue_final_message, documents) is set.
type TokenizeRequest struct {
	// Model is the served model name the request names.
	Model string
	// Prompt is a completions prompt.
	Prompt string
	// Chat holds a chat request's template fields, sent as they came.
	Chat map[string]any
}

// TokenizerConfig configures a Tokenizer.
type TokenizerConfig struct {
	// URL is the tokenize endpoint to call ("http://host:port/tokenize").
	// Empty means: call Path on the endpoint the caller names (a candidate
	// model server). Default empty.
	URL string
	// Scheme and Path build the URL on a named endpoint. Defaults "http"
	// and "/tokenize" (vLLM's OpenAI server).
	Scheme, Path string
	// MaxResponseBytes bounds a tokenize answer. Default 8 MiB; must be
	// positive.
	MaxResponseBytes int64
	// Client is the HTTP client. Default: a client with keep-alives and
	// no timeout of its own (every call carries the caller's deadline).
	Client *http.Client
}

// DefaultTokenizerConfig returns the defaults documented on
// TokenizerConfig.
func DefaultTokenizerConfig() TokenizerConfig {
	return TokenizerConfig{Scheme: "http", Path: "/tokenize", MaxResponseBytes: 8 << 20}
}

// MaxTokenizerResponseBytes is the largest maxResponseBytes accepted: a
// bound on what one answer may make the producer hold (the answer for the
// largest prompt kvindex looks up, 131,072 tokens, is about 1 MB), and far
// from the int64 limit the read adds one byte to.
const MaxTokenizerResponseBytes = 1 << 30

// Validate reports the first field out of range.
func (c TokenizerConfig) Validate() error {
	switch {
	case c.Scheme != "http" && c.Scheme != "https":
		return fmt.Errorf("%w: tokenizer scheme %q: want http or https", ErrInvalidConfig, c.Scheme)
	case !strings.HasPrefix(c.Path, "/"):
		return fmt.Errorf("%w: tokenizer path %q must start with /", ErrInvalidConfig, c.Path)
	case c.MaxResponseBytes <= 0 || c.MaxResponseBytes > MaxTokenizerResponseBytes:
		return fmt.Errorf("%w: tokenizer maxResponseBytes %d: want 1 to %d (1 GiB)", ErrInvalidConfig, c.MaxResponseBytes, int64(MaxTokenizerResponseBytes))
	case c.URL != "" && !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://"):
		return fmt.Errorf("%w: tokenizer url %q must be http:// or https://", ErrInvalidConfig, c.URL)
	}
	if c.URL != "" {
		if u, err := url.Parse(c.URL); err != nil || u.Host == "" {
			return fmt.Errorf("%w: tokenizer url %q names no host", ErrInvalidConfig, c.URL)
		}
	}
	return nil
}

// Tokenizer asks a model server's tokenize endpoint (vLLM's OpenAI server
// POST /tokenize) for a prompt's token ids. vLLM applies the model's chat
// template to chat messages there, so the ids are the ones the engine
// hashes. It is safe for concurrent use.
type Tokenizer struct {
	cfg    TokenizerConfig
	client *http.Client
}

// NewTokenizer returns a Tokenizer; it errors for an invalid cfg.
func NewTokenizer(cfg TokenizerConfig) (*Tokenizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.Client
	if c == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 16
		tr.IdleConnTimeout = 90 * time.Second
		c = &http.Client{Transport: tr}
	}
	return &Tokenizer{cfg: cfg, client: c}, nil
}

// Fixed reports whether the tokenizer calls one configured URL rather
// than a model server the caller names.
func (t *Tokenizer) Fixed() bool { return t.cfg.URL != "" }

// tokenizeAnswer is the part of vLLM's /tokenize answer the plugin reads.
type tokenizeAnswer struct {
	// Tokens is nil when the answer has no tokens field (or null): a
	// server of another schema, which must not pass for an empty prompt.
	Tokens *[]int64 `json:"tokens"`
}

// Tokenize returns req's token ids, asking the configured URL, or else
// Path on hostPort ("address:port" of a model server). Errors wrap
// ErrTokenize (an answer without a tokens list included: a server of
// another schema), or ErrNoPrompt for an empty request or an answer of no
// tokens; a context error is wrapped too, and errors.Is finds it.
func (t *Tokenizer) Tokenize(ctx context.Context, hostPort string, req TokenizeRequest) ([]uint32, error) {
	body := map[string]any{"model": req.Model}
	switch {
	case req.Chat != nil:
		for k, v := range req.Chat {
			body[k] = v
		}
	case req.Prompt != "":
		body["prompt"] = req.Prompt
	default:
		return nil, ErrNoPrompt
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding the request: %v", ErrTokenize, err)
	}
	url := t.cfg.URL
	if url == "" {
		if hostPort == "" {
			return nil, fmt.Errorf("%w: no tokenizer URL and no endpoint", ErrTokenize)
		}
		url = t.cfg.Scheme + "://" + hostPort + t.cfg.Path
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenize, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenize, err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, t.cfg.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading the answer: %w", ErrTokenize, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s answered %s: %.200s", ErrTokenize, url, resp.Status, data)
	}
	if int64(len(data)) > t.cfg.MaxResponseBytes {
		return nil, fmt.Errorf("%w: answer over maxResponseBytes (%d)", ErrTokenize, t.cfg.MaxResponseBytes)
	}
	var ans tokenizeAnswer
	if err := json.Unmarshal(data, &ans); err != nil {
		return nil, fmt.Errorf("%w: decoding the answer: %v", ErrTokenize, err)
	}
	if ans.Tokens == nil {
		return nil, fmt.Errorf("%w: %s answered without a tokens list: %.200s", ErrTokenize, url, data)
	}
	if len(*ans.Tokens) == 0 {
		return nil, fmt.Errorf("%w: %s answered no tokens", ErrNoPrompt, url)
	}
	ids := make([]uint32, len(*ans.Tokens))
	for i, v := range *ans.Tokens {
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("%w: token %d is %d, outside uint32", ErrTokenize, i, v)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

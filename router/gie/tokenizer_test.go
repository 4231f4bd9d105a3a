package gie_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/router/gie"
	"github.com/kvindex/kvindex/router/gie/internal/epptest"
)

func newTokenizer(t *testing.T, cfg gie.TokenizerConfig) *gie.Tokenizer {
	t.Helper()
	tk, err := gie.NewTokenizer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestTokenize(t *testing.T) {
	srv := epptest.StartTokenizer(t)
	cfg := gie.DefaultTokenizerConfig()
	onEndpoint := newTokenizer(t, cfg)
	cfg.URL = srv.URL()
	fixed := newTokenizer(t, cfg)
	host := strings.TrimPrefix(srv.Server.URL, "http://")
	msgs := []any{map[string]any{"role": "user", "content": "hello there"}}
	tests := []struct {
		name string
		tk   *gie.Tokenizer
		host string
		req  gie.TokenizeRequest
		want []uint32
	}{
		{"completion_on_endpoint", onEndpoint, host, gie.TokenizeRequest{Model: "m", Prompt: "a b c"}, epptest.Words("a b c")},
		{"completion_fixed_url", fixed, "", gie.TokenizeRequest{Model: "m", Prompt: "a b c"}, epptest.Words("a b c")},
		{"chat_default_generation_prompt", fixed, "", gie.TokenizeRequest{Model: "m", Chat: map[string]any{"messages": msgs}},
			epptest.ChatWords([]map[string]string{{"role": "user", "content": "hello there"}}, true)},
		{"chat_without_generation_prompt", fixed, "", gie.TokenizeRequest{Model: "m", Chat: map[string]any{"messages": msgs, "add_generation_prompt": false}},
			epptest.ChatWords([]map[string]string{{"role": "user", "content": "hello there"}}, false)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.tk.Tokenize(t.Context(), tc.host, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("tokens (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokenizeErrors(t *testing.T) {
	answer := func(status int, body string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(s.Close)
		return s
	}
	tests := []struct {
		name    string
		srv     *httptest.Server
		maxResp int64
		req     gie.TokenizeRequest
		want    error
	}{
		{"server_error", answer(500, "boom"), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"not_json", answer(200, "tokens"), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"negative_token", answer(200, `{"tokens":[1,-2]}`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"token_over_uint32", answer(200, `{"tokens":[4294967296]}`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"answer_too_large", answer(200, `{"tokens":[1,2,3,4,5,6,7,8,9]}`), 10, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"empty_request", answer(200, `{"tokens":[]}`), 0, gie.TokenizeRequest{Model: "m"}, gie.ErrNoPrompt},
		// A server of another schema answers 200 without tokens: not an
		// empty prompt.
		{"no_tokens_field", answer(200, `{"input_ids":[1,2]}`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"tokens_null", answer(200, `{"tokens":null}`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"json_null", answer(200, `null`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrTokenize},
		{"no_tokens", answer(200, `{"tokens":[]}`), 0, gie.TokenizeRequest{Model: "m", Prompt: "x"}, gie.ErrNoPrompt},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gie.DefaultTokenizerConfig()
			cfg.URL = tc.srv.URL + "/tokenize"
			if tc.maxResp > 0 {
				cfg.MaxResponseBytes = tc.maxResp
			}
			_, err := newTokenizer(t, cfg).Tokenize(t.Context(), "", tc.req)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestTokenizeDeadline(t *testing.T) {
	srv := epptest.StartTokenizer(t)
	srv.Delay.Store(int64(5 * time.Second))
	cfg := gie.DefaultTokenizerConfig()
	cfg.URL = srv.URL()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := newTokenizer(t, cfg).Tokenize(ctx, "", gie.TokenizeRequest{Model: "m", Prompt: "x"})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, gie.ErrTokenize) {
		t.Fatalf("err = %v, want ErrTokenize wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the call took %v, past its 50ms deadline", d)
	}
}

func TestTokenizerConfigValidate(t *testing.T) {
	for _, mod := range []func(*gie.TokenizerConfig){
		func(c *gie.TokenizerConfig) { c.Scheme = "grpc" },
		func(c *gie.TokenizerConfig) { c.Path = "tokenize" },
		func(c *gie.TokenizerConfig) { c.MaxResponseBytes = 0 },
		func(c *gie.TokenizerConfig) { c.URL = "ftp://x" },
	} {
		c := gie.DefaultTokenizerConfig()
		mod(&c)
		if _, err := gie.NewTokenizer(c); !errors.Is(err, gie.ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", c, err)
		}
	}
}

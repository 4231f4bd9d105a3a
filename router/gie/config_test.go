package gie

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseProducerParamsDefaults(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"dns:///indexd:50051"}`))
	if err != nil {
		t.Fatal(err)
	}
	ttl, lag, check, stale := Duration(2*time.Second), Duration(500*time.Millisecond), Duration(10*time.Second), Duration(30*time.Second)
	want := ProducerParams{
		Target:                "dns:///indexd:50051",
		TokenizeTimeout:       Duration(150 * time.Millisecond),
		LookupTimeout:         Duration(100 * time.Millisecond),
		Tokenizer:             TokenizerParams{Scheme: "http", Path: "/tokenize", MaxResponseBytes: 8 << 20},
		BlockSize:             16,
		MaxPromptTokens:       65536,
		SpeculativeTTL:        &ttl,
		SpeculativeIndexLag:   &lag,
		SpeculativeMaxEntries: 200000,
		IdentityCheckInterval: &check,
		MaxStaleness:          &stale,
		Fallback:              FallbackApproximate,
		FallbackLogInterval:   Duration(10 * time.Second),
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if got, lora := p.mapModel("m"); got != "m" || lora != "" {
		t.Errorf("identity model mapping = %q %q", got, lora)
	}
}

func TestParseProducerParamsMapping(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"x:1","models":[{"match":"sql-lora","model":"llama","lora":"sql"},{"match":"llama"}],
		"speculativeTTL":"0s","fallback":"none","podIdentity":"pod-name","ranks":"none"}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, model, lora string }{{"sql-lora", "llama", "sql"}, {"llama", "llama", ""}, {"other", "other", ""}} {
		if m, l := p.mapModel(tc.in); m != tc.model || l != tc.lora {
			t.Errorf("mapModel(%q) = %q %q, want %q %q", tc.in, m, l, tc.model, tc.lora)
		}
	}
	if *p.SpeculativeTTL != 0 {
		t.Errorf("explicit 0s TTL became %v", *p.SpeculativeTTL)
	}
}

func TestParseProducerParamsErrors(t *testing.T) {
	for name, raw := range map[string]string{
		"empty":             ``,
		"no_target":         `{}`,
		"unknown_field":     `{"target":"x:1","blockSizeTokens":16}`,
		"bad_duration":      `{"target":"x:1","lookupTimeout":"soon"}`,
		"number_duration":   `{"target":"x:1","lookupTimeout":100}`,
		"over_budget":       `{"target":"x:1","tokenizeTimeout":"300ms","lookupTimeout":"100ms"}`,
		"sum_wraps":         `{"target":"x:1","tokenizeTimeout":"9223372036854775807ns","lookupTimeout":"1ns"}`,
		"both_huge":         `{"target":"x:1","tokenizeTimeout":"2562047h","lookupTimeout":"2562047h"}`,
		"trailing_garbage":  `{"target":"x:1"}garbage`,
		"field_case":        `{"TARGET":"x:1"}`,
		"nested_field_case": `{"target":"x:1","tokenizer":{"URL":"http://tok:8000/tokenize"}}`,
		"model_field_case":  `{"target":"x:1","models":[{"Match":"a"}]}`,
		"second_object":     `{"target":"x:1"} {"bogus":1}`,
		"negative_timeout":  `{"target":"x:1","lookupTimeout":"-1ms"}`,
		"cert_without_key":  `{"target":"x:1","caFile":"ca","certFile":"c"}`,
		"cert_without_ca":   `{"target":"x:1","certFile":"c","keyFile":"k"}`,
		"server_name_no_ca": `{"target":"x:1","serverName":"indexd"}`,
		"fallback":          `{"target":"x:1","fallback":"random"}`,
		"pod_identity":      `{"target":"x:1","podIdentity":"ip"}`,
		"model_repeats":     `{"target":"x:1","models":[{"match":"a"},{"match":"a"}]}`,
		"model_no_match":    `{"target":"x:1","models":[{"model":"a"}]}`,
		"block_size":        `{"target":"x:1","blockSize":-16}`,
		"tokenizer_path":    `{"target":"x:1","tokenizer":{"path":"tokenize"}}`,
		"tokenizer_no_host": `{"target":"x:1","tokenizer":{"url":"http://"}}`,
		"negative_ttl":      `{"target":"x:1","speculativeTTL":"-1s"}`,
		"negative_lag":      `{"target":"x:1","speculativeIndexLag":"-1s"}`,
		"negative_check":    `{"target":"x:1","identityCheckInterval":"-1s"}`,
		// Decoded onto the defaults: an explicit zero is a value, not
		// "use the default".
		"explicit_zero_timeout":    `{"target":"x:1","lookupTimeout":"0s"}`,
		"explicit_zero_block_size": `{"target":"x:1","blockSize":0}`,
		"max_prompt_tokens_over":   `{"target":"x:1","maxPromptTokens":1048577}`,
		"max_prompt_tokens_neg":    `{"target":"x:1","maxPromptTokens":-1}`,
		"max_response_overflow":    `{"target":"x:1","tokenizer":{"maxResponseBytes":9223372036854775807}}`,
		"duplicate_field":          `{"target":"x:1","target":"y:1"}`,
		"duplicate_nested_field":   `{"target":"x:1","tokenizer":{"path":"/a","path":"/b"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseProducerParams([]byte(raw)); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestParseProducerParamsMaxPromptTokensBound: the largest accepted
// maxPromptTokens is MaxMatcherPromptTokens.
func TestParseProducerParamsMaxPromptTokensBound(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"x:1","maxPromptTokens":1048576}`))
	if err != nil || p.MaxPromptTokens != MaxMatcherPromptTokens {
		t.Fatalf("maxPromptTokens 1048576: %+v, %v; want it accepted", p.MaxPromptTokens, err)
	}
}

func TestParseTierScorerParams(t *testing.T) {
	w, err := ParseTierScorerParams(nil)
	if err != nil || w != DefaultTierWeights() {
		t.Fatalf("defaults = %+v, %v", w, err)
	}
	w, err = ParseTierScorerParams([]byte(`{"cpu":0.5}`))
	if err != nil || w != (TierWeights{GPU: 1, CPU: 0.5, Disk: 0.5}) {
		t.Fatalf("cpu 0.5 = %+v, %v", w, err)
	}
	for _, raw := range []string{`{"cpu":1.5}`, `{"gpu":-1}`, `{"nvme":1}`, `{"gpu":1}xyz`, `{"gpu":0.5,"Gpu":0.2}`} {
		if _, err := ParseTierScorerParams([]byte(raw)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", raw, err)
		}
	}
}

// TestParseProducerParamsNamesTheField: a bad duration and a field name
// that differs only in case are refused naming the field.
func TestParseProducerParamsNamesTheField(t *testing.T) {
	for raw, want := range map[string]string{
		`{"target":"x:1","lookupTimeout":"abc"}`:                   `lookupTimeout: time: invalid duration "abc"`,
		`{"target":"x:1","speculativeTTL":"1 s"}`:                  `speculativeTTL: time: unknown unit`,
		`{"target":"x:1","tokenizer":{"URL":"http://t/tokenize"}}`: `tokenizer.URL: unknown field "URL" (names are case-sensitive: "url")`,
		`{"Target":"x:1"}`: `Target: unknown field "Target" (names are case-sensitive: "target")`,
		`{"target":"x:1","lookupTimeout":"50ms","lookupTimeout":"60ms"}`: `lookupTimeout: field given twice`,
		// Before, a null duration was refused as time: invalid duration "".
		`{"target":"x:1","tokenizeTimeout":null}`: `tokenizeTimeout: null: leave the field out for its default`,
		`{"target":"x:1","speculativeTTL":null}`:  `speculativeTTL: null: leave the field out for its default`,
	} {
		_, err := ParseProducerParams([]byte(raw))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrInvalidConfig with %q", raw, err, want)
		}
	}
}

func TestParseProducerParamsKeepsDefaultsOfFieldsLeftOut(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"x:1","tokenizer":{"url":"http://tok:8000/tokenize"},"lookupTimeout":"50ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultProducerParams()
	want.Target = "x:1"
	want.Tokenizer.URL = "http://tok:8000/tokenize"
	want.LookupTimeout = Duration(50 * time.Millisecond)
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestNewProducerTakesPartialParams(t *testing.T) {
	for name, params := range map[string]ProducerParams{
		"target_only":          {Target: "127.0.0.1:1"},
		"hand_built_some":      {Target: "127.0.0.1:1", BlockSize: 32, Fallback: FallbackNone},
		"ttl_zero_pointer_nil": {Target: "127.0.0.1:1", SpeculativeMaxEntries: 10},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := NewProducer("", params, &laggingIndex{clock: &clock{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.matcher.spec == nil {
				t.Error("speculative entries off with the default TTL")
			}
		})
	}
	if _, err := NewProducer("", ProducerParams{}, &laggingIndex{clock: &clock{}}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no target: err = %v, want ErrInvalidConfig", err)
	}
	if err := (ProducerParams{Target: "x:1"}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Validate of unfilled params: err = %v, want ErrInvalidConfig (and no panic)", err)
	}
}

// TestExplicitZerosKeepTheirMeaning: a field given as zero is kept where
// zero means something and refused where it does not; it never becomes the
// default on the way from ParseProducerParams to NewProducer.
func TestExplicitZerosKeepTheirMeaning(t *testing.T) {
	p, err := ParseProducerParams([]byte(`{"target":"x:1","speculativeIndexLag":"0s","identityCheckInterval":"0s"}`))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := NewProducer("", p, &laggingIndex{clock: &clock{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := *pr.params.SpeculativeIndexLag; got != 0 {
		t.Errorf("speculativeIndexLag \"0s\" became %v", time.Duration(got))
	}
	if pr.matcher.spec == nil || pr.matcher.spec.indexLag != 0 {
		t.Errorf("speculative entries: %+v, want on with an index lag of 0", pr.matcher.spec)
	}
	if got := *pr.params.IdentityCheckInterval; got != 0 {
		t.Errorf("identityCheckInterval \"0s\" became %v", time.Duration(got))
	}
	for _, raw := range []string{
		`{"target":"x:1","speculativeMaxEntries":0}`,
		`{"target":"x:1","fallbackLogInterval":"0s"}`,
		`{"target":"x:1","speculativeIndexLag":null}`,
		`{"target":"x:1","rankPortStride":65536}`,
	} {
		if _, err := ParseProducerParams([]byte(raw)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", raw, err)
		}
	}
}

// A nil *KVIndex is no index, as a nil Index is: refused at construction,
// not a nil dereference on the first request.
func TestNewProducerRefusesNilKVIndex(t *testing.T) {
	if _, err := NewProducer("", ProducerParams{Target: "x:1"}, (*KVIndex)(nil), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("err = %v, want ErrInvalidConfig", err)
	}
}

// TestParamsPastIndexdLimitsRefused: parameters with which every Lookup
// could only fall back are refused at load, naming the field: a kvindex
// model (models[].model, or models[].match when model is empty) past
// keyspace.MaxNameLen (512 bytes) or not UTF-8, a models[].lora past
// indexd's default --max-extra-bytes (1024), a blockSize past the
// client's MaxHasherBlockSize or above maxPromptTokens (no prompt looked
// up would fill a block). The limits themselves are accepted. Before,
// all of these loaded.
func TestParamsPastIndexdLimitsRefused(t *testing.T) {
	if MaxModelBytes != 512 || MaxLoRABytes != 1024 || MaxBlockSize != 1<<20 {
		t.Fatalf("limits %d, %d, %d: want keyspace.MaxNameLen 512, indexd.DefaultMaxExtraBytes 1024, client.MaxHasherBlockSize 1<<20",
			MaxModelBytes, MaxLoRABytes, MaxBlockSize)
	}
	long := func(n int) string { return strings.Repeat("x", n) }
	for raw, want := range map[string]string{
		`{"target":"x:1","models":[{"match":"a","lora":"` + long(1025) + `"}]}`:               "models[0].lora is 1025 bytes",
		`{"target":"x:1","models":[{"match":"a","lora":"` + long(2000) + `"}]}`:               "models[0].lora is 2000 bytes",
		`{"target":"x:1","models":[{"match":"a"},{"match":"b","model":"` + long(513) + `"}]}`: "models[1].model is 513 bytes",
		`{"target":"x:1","models":[{"match":"a","model":"` + long(600) + `"}]}`:               "models[0].model is 600 bytes",
		`{"target":"x:1","models":[{"match":"` + long(513) + `"}]}`:                           "models[0].match is 513 bytes",
		`{"target":"x:1","blockSize":1000000000}`:                                             "blockSize 1000000000: at most 1048576 tokens",
		`{"target":"x:1","blockSize":1048577,"maxPromptTokens":1048576}`:                      "blockSize 1048577: at most 1048576",
		`{"target":"x:1","blockSize":64,"maxPromptTokens":32}`:                                "blockSize 64 is above maxPromptTokens 32",
		`{"target":"x:1","blockSize":131072}`:                                                 "blockSize 131072 is above maxPromptTokens 65536",
	} {
		_, err := ParseProducerParams([]byte(raw))
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%.100s: %v, want ErrInvalidConfig with %q", raw, err, want)
		}
	}
	// JSON decoding replaces invalid UTF-8; a hand-built ProducerParams
	// can still hold it, and gRPC would refuse to marshal it.
	for _, mm := range []ModelMapping{{Match: "a", Model: "\xff"}, {Match: "a", LoRA: "\xff"}, {Match: "\xff"}} {
		p := DefaultProducerParams()
		p.Target, p.Models = "x:1", []ModelMapping{mm}
		if err := p.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "valid UTF-8") {
			t.Errorf("%+q: %v, want ErrInvalidConfig naming UTF-8", mm, err)
		}
	}
	for _, raw := range []string{
		`{"target":"x:1","models":[{"match":"a","lora":"` + long(1024) + `"}]}`,
		`{"target":"x:1","models":[{"match":"a","model":"` + long(512) + `"}]}`,
		`{"target":"x:1","models":[{"match":"` + long(512) + `"}]}`,
		// A long request model is fine when it maps to a short kvindex model.
		`{"target":"x:1","models":[{"match":"` + long(2000) + `","model":"llama"}]}`,
		`{"target":"x:1","blockSize":1048576,"maxPromptTokens":1048576}`,
		`{"target":"x:1","blockSize":32,"maxPromptTokens":32}`,
	} {
		if _, err := ParseProducerParams([]byte(raw)); err != nil {
			t.Errorf("%.100s: %v, want it accepted", raw, err)
		}
	}
}

package gie

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvindex/kvindex/client"
)

// PrepareDataBudget is the GIE director's fixed budget for all PrepareData
// plugins of a request together (prepareDataTimeout in
// pkg/epp/requestcontrol/director.go, v1.5.0). The producer's
// tokenizeTimeout plus lookupTimeout must stay below it.
const PrepareDataBudget = 400 * time.Millisecond

// Fallback modes (ProducerParams.Fallback).
const (
	// FallbackApproximate leaves the approximate producer's attribute in
	// place when kvindex cannot answer. The default.
	FallbackApproximate = "approximate"
	// FallbackNone writes zero matches on every candidate instead.
	FallbackNone = "none"
)

// Duration is a time.Duration written in JSON as a Go duration string
// ("150ms", "2s").
type Duration time.Duration

// UnmarshalJSON parses a duration string; null leaves d as it is (the
// default, as encoding/json leaves a field for null).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"150ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// ModelMapping maps a request's model to what kvindex knows: the model
// name the bridge publishes under, and the LoRA adapter.
type ModelMapping struct {
	// Match is the request's target model (after GIE's model rewrites).
	Match string `json:"match"`
	// Model is the kvindex model; empty means Match itself.
	Model string `json:"model,omitempty"`
	// LoRA is the adapter name vLLM folds into block hashes; empty for
	// the base model.
	LoRA string `json:"lora,omitempty"`
}

// Limits of indexd that a models entry must stay within: indexd refuses a
// Lookup past them on every request (INVALID_ARGUMENT), so an entry past
// them could only ever fall back. The plugin does not import indexd or
// the main module's internal/keyspace (its module graph holds the client
// and proto modules only), so they are mirrored here.
const (
	// MaxModelBytes is the longest kvindex model name, in bytes:
	// keyspace.MaxNameLen (internal/keyspace/names.go; docs/limits.md,
	// "model and pod name length"), which indexd's Lookup checks with
	// keyspace.ValidateName.
	MaxModelBytes = 512
	// MaxLoRABytes is the longest LoRA name, in bytes: indexd's
	// DefaultMaxExtraBytes (indexd/config.go, --max-extra-bytes;
	// docs/limits.md, "bytes of each token Lookup extra").
	MaxLoRABytes = 1024
)

// MaxBlockSize is the largest blockSize: the client's
// MaxHasherBlockSize, the largest block size kvindex's client takes
// (engines use 16 to a few hundred).
const MaxBlockSize = client.MaxHasherBlockSize

// TokenizerParams are the producer's tokenizer settings.
type TokenizerParams struct {
	// URL is a fixed tokenize endpoint; empty (default) asks a candidate
	// model server's Path.
	URL string `json:"url,omitempty"`
	// Scheme and Path on a candidate model server. Defaults "http",
	// "/tokenize".
	Scheme string `json:"scheme,omitempty"`
	Path   string `json:"path,omitempty"`
	// MaxResponseBytes bounds an answer. Default 8 MiB.
	MaxResponseBytes int64 `json:"maxResponseBytes,omitempty"`
}

// ProducerParams are the parameters of kvindex-prefix-cache-producer, as
// written in the EndpointPickerConfig (docs/router.md lists them with
// their defaults). Unknown fields are an error.
type ProducerParams struct {
	// Target is indexd's gRPC target (client.New's forms: "dns:///host:port",
	// "host:port" or a comma-separated list). Required unless CellMap is
	// set; never with it.
	Target string `json:"target,omitempty"`
	// CellMap serves a cell map instead of one target (docs/DESIGN.md
	// "Cells"): the map itself (a JSON object, written inline), or the
	// path of a cell map file, watched for changes (a mounted ConfigMap).
	// A spread model's partial answer (a cell did not answer) is used and
	// counted as a fallback with reason "partial". Default "": Target.
	CellMap string `json:"cellMap,omitempty"`
	// CAFile, CertFile, KeyFile and ServerName configure TLS to indexd:
	// CAFile turns TLS on (the CA that signed indexd's certificate),
	// CertFile and KeyFile add a client certificate (mTLS), ServerName
	// overrides the name checked. All empty: plaintext.
	CAFile     string `json:"caFile,omitempty"`
	CertFile   string `json:"certFile,omitempty"`
	KeyFile    string `json:"keyFile,omitempty"`
	ServerName string `json:"serverName,omitempty"`
	// Models maps request models; a model not listed is looked up under
	// its own name with no LoRA.
	Models []ModelMapping `json:"models,omitempty"`
	// PodIdentity, Ranks and RankPortStride map endpoints to kvindex pod
	// identities (IdentityMapper). Defaults address-port, suffix, 1.
	PodIdentity    string `json:"podIdentity,omitempty"`
	Ranks          string `json:"ranks,omitempty"`
	RankPortStride int    `json:"rankPortStride,omitempty"`
	// TokenizeTimeout bounds one tokenize call. Default 150ms.
	TokenizeTimeout Duration `json:"tokenizeTimeout,omitempty"`
	// LookupTimeout bounds one Lookup. Default 100ms.
	LookupTimeout Duration `json:"lookupTimeout,omitempty"`
	// Tokenizer settings.
	Tokenizer TokenizerParams `json:"tokenizer,omitzero"`
	// BlockSize is the block size assumed for endpoints the index does not
	// match, and the speculative entries' block size. Default 16.
	BlockSize int `json:"blockSize,omitempty"`
	// MaxPromptTokens caps the tokens looked up. Default 65536.
	MaxPromptTokens int `json:"maxPromptTokens,omitempty"`
	// SpeculativeTTL is how long a chosen endpoint's prompt blocks are
	// remembered; "0s" turns speculative entries off. Default 2s.
	SpeculativeTTL *Duration `json:"speculativeTTL,omitempty"`
	// SpeculativeIndexLag is how far past a routing decision an index
	// answer's progress time must be for the answer to reflect what the
	// chosen endpoint reported after the decision; from then on the
	// decision's speculative entries no longer count. It is the bound the
	// deployment keeps on the produce → etcd lag of KV events. Default
	// 500ms; "0s" drops entries at the first answer newer than the
	// decision (a pointer, so that an explicit 0s is kept).
	SpeculativeIndexLag *Duration `json:"speculativeIndexLag,omitempty"`
	// SpeculativeMaxEntries bounds the remembered (block, endpoint)
	// entries; a prompt of more blocks keeps its leading ones. Default
	// 200000 (about 30 MB of heap, at 150 B per entry:
	// BenchmarkSpeculativeMemory); at least 1 (speculativeTTL "0s" turns
	// the entries off).
	SpeculativeMaxEntries int `json:"speculativeMaxEntries,omitempty"`
	// IdentityCheckInterval is the least time between two checks, per
	// model, of why a Lookup matched no candidate (an identity mismatch or
	// an unknown model: docs/router.md), each one ListEndpoints call; also
	// the least time between two such WARN lines. Default 10s; "0s" turns
	// the checks off.
	IdentityCheckInterval *Duration `json:"identityCheckInterval,omitempty"`
	// MaxStaleness is the oldest an answer may be: an answer whose
	// progress time (IndexAnswer.ProgressTime) is further than this in
	// the past, by the EPP's clock, is not used but counted as a fallback
	// with reason "stale" (docs/DESIGN.md "Staleness": when every indexd
	// replica is stale the router falls back to its own scoring). An
	// answer without a progress time is not judged. Default 30s, indexd's
	// default --max-staleness; "0s" turns the check off (a pointer, so
	// that an explicit 0s is kept).
	MaxStaleness *Duration `json:"maxStaleness,omitempty"`
	// Fallback is approximate (default) or none.
	Fallback string `json:"fallback,omitempty"`
	// FallbackLogInterval is the least time between two fallback log
	// lines (the counter counts all). Default 10s; positive.
	FallbackLogInterval Duration `json:"fallbackLogInterval,omitempty"`
}

// Defaults of the producer's parameters.
const (
	DefaultTokenizeTimeout       = 150 * time.Millisecond
	DefaultLookupTimeout         = 100 * time.Millisecond
	DefaultSpeculativeTTL        = 2 * time.Second
	DefaultSpeculativeIndexLag   = 500 * time.Millisecond
	DefaultSpeculativeMaxEntries = 200000
	DefaultFallbackLogInterval   = 10 * time.Second
	DefaultIdentityCheckInterval = 10 * time.Second
	// DefaultMaxStaleness is indexd's default --max-staleness
	// (indexd.DefaultMaxStaleness, indexd/config.go), past which a
	// replica reports itself not ready: the ingesters' default liveness
	// window, past which a stale index may name endpoints that are gone.
	DefaultMaxStaleness = 30 * time.Second
)

// DefaultProducerParams returns every parameter at its default, Target
// left empty (it is required). ParseProducerParams decodes onto it, the
// way GIE decodes its own plugins' parameters onto their defaults.
func DefaultProducerParams() ProducerParams {
	var p ProducerParams
	p.FillDefaults()
	return p
}

// decodeStrict decodes the one JSON value raw holds into v: unknown
// fields, field names that match only when case is ignored (which
// encoding/json would take), a bad duration (named by its field), and
// anything after the value are errors wrapping ErrInvalidConfig
// (encoding/json's Decoder reads one value and would ignore the rest).
func decodeStrict(raw json.RawMessage, v any) error {
	if err := checkFields(raw, reflect.TypeOf(v), ""); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: data after the parameters' JSON object", ErrInvalidConfig)
	}
	return nil
}

// durationType is the parameters' duration; checkFields parses its
// fields itself to name them in errors.
var durationType = reflect.TypeFor[Duration]()

// checkFields walks raw against type t (path names where, for errors):
// every object key must be a field's JSON name exactly, and every
// duration must parse. Values of the wrong JSON type are left to the
// decoder, whose errors name them.
func checkFields(raw json.RawMessage, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		var d Duration
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return fmt.Errorf("%s: null: leave the field out for its default, or give a duration such as \"150ms\"", path)
		}
		if err := d.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("%s: %v", path, err)
		}
	case t.Kind() == reflect.Struct:
		obj, err := objectFields(raw)
		if err != nil {
			return nil // not an object: the decoder names what is wrong
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			fields[name] = f.Type
		}
		seen := make(map[string]bool, len(obj))
		for _, kv := range obj {
			key, val := kv.key, kv.val
			if seen[key] {
				return fmt.Errorf("%s: field given twice (strict decoding keeps neither)", join(path, key))
			}
			seen[key] = true
			ft, ok := fields[key]
			if !ok {
				for name := range fields {
					if strings.EqualFold(name, key) {
						return fmt.Errorf("%s: unknown field %q (names are case-sensitive: %q)", join(path, key), key, name)
					}
				}
				return fmt.Errorf("unknown field %q", join(path, key))
			}
			if err := checkFields(val, ft, join(path, key)); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return nil
		}
		for i, e := range elems {
			if err := checkFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// objectField is one member of a JSON object, in document order.
type objectField struct {
	key string
	val json.RawMessage
}

// objectFields returns raw's members in document order, repeated keys
// included (a map would keep the last silently), or an error when raw is
// not one JSON object.
func objectFields(raw json.RawMessage) ([]objectField, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not an object")
	}
	var out []objectField
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, err
		}
		out = append(out, objectField{key: key, val: val})
	}
	return out, nil
}

// join names field key below path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// ParseProducerParams decodes raw strictly (unknown fields are an error)
// onto DefaultProducerParams and validates: a field left out keeps its
// default, a field given keeps its value (an explicit "0s" where zero is
// out of range is an error, not the default). A nil or empty raw is an
// error: the target is required.
func ParseProducerParams(raw json.RawMessage) (ProducerParams, error) {
	p := DefaultProducerParams()
	if len(bytes.TrimSpace(raw)) == 0 {
		return p, fmt.Errorf("%w: parameters are required (at least target)", ErrInvalidConfig)
	}
	if err := decodeStrict(raw, &p); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// FillDefaults sets every zero (or nil) field to its default, Target
// excepted: a hand-built or partial ProducerParams becomes a complete one.
// NewProducer applies it, so a zero field there means the default.
func (p *ProducerParams) FillDefaults() {
	if p.TokenizeTimeout == 0 {
		p.TokenizeTimeout = Duration(DefaultTokenizeTimeout)
	}
	if p.LookupTimeout == 0 {
		p.LookupTimeout = Duration(DefaultLookupTimeout)
	}
	td := DefaultTokenizerConfig()
	if p.Tokenizer.Scheme == "" {
		p.Tokenizer.Scheme = td.Scheme
	}
	if p.Tokenizer.Path == "" {
		p.Tokenizer.Path = td.Path
	}
	if p.Tokenizer.MaxResponseBytes == 0 {
		p.Tokenizer.MaxResponseBytes = td.MaxResponseBytes
	}
	md := DefaultMatcherConfig()
	if p.BlockSize == 0 {
		p.BlockSize = md.BlockSize
	}
	if p.MaxPromptTokens == 0 {
		p.MaxPromptTokens = md.MaxPromptTokens
	}
	if p.SpeculativeTTL == nil {
		d := Duration(DefaultSpeculativeTTL)
		p.SpeculativeTTL = &d
	}
	if p.SpeculativeIndexLag == nil {
		d := Duration(DefaultSpeculativeIndexLag)
		p.SpeculativeIndexLag = &d
	}
	if p.SpeculativeMaxEntries == 0 {
		p.SpeculativeMaxEntries = DefaultSpeculativeMaxEntries
	}
	if p.IdentityCheckInterval == nil {
		d := Duration(DefaultIdentityCheckInterval)
		p.IdentityCheckInterval = &d
	}
	if p.MaxStaleness == nil {
		d := Duration(DefaultMaxStaleness)
		p.MaxStaleness = &d
	}
	if p.Fallback == "" {
		p.Fallback = FallbackApproximate
	}
	if p.FallbackLogInterval == 0 {
		p.FallbackLogInterval = Duration(DefaultFallbackLogInterval)
	}
}

// Validate reports the first parameter out of range.
func (p ProducerParams) Validate() error {
	if (p.Target == "") == (p.CellMap == "") {
		return fmt.Errorf("%w: exactly one of target and cellMap is required", ErrInvalidConfig)
	}
	if (p.CertFile == "") != (p.KeyFile == "") {
		return fmt.Errorf("%w: certFile and keyFile go together", ErrInvalidConfig)
	}
	if p.CertFile != "" && p.CAFile == "" {
		return fmt.Errorf("%w: certFile needs caFile (TLS)", ErrInvalidConfig)
	}
	if p.ServerName != "" && p.CAFile == "" {
		return fmt.Errorf("%w: serverName needs caFile (TLS)", ErrInvalidConfig)
	}
	seen := map[string]bool{}
	for i, m := range p.Models {
		if m.Match == "" {
			return fmt.Errorf("%w: models[%d].match is empty", ErrInvalidConfig, i)
		}
		if seen[m.Match] {
			return fmt.Errorf("%w: models[%d].match %q repeats", ErrInvalidConfig, i, m.Match)
		}
		seen[m.Match] = true
		// What the Lookup sends: the kvindex model (match when model is
		// empty) and the LoRA name, both proto3 strings (UTF-8).
		field, model := "model", m.Model
		if model == "" {
			field, model = "match", m.Match
		}
		if len(model) > MaxModelBytes || !utf8.ValidString(model) {
			return fmt.Errorf("%w: models[%d].%s is %d bytes: the kvindex model must be valid UTF-8 of at most %d bytes (indexd refuses a longer one on every Lookup)",
				ErrInvalidConfig, i, field, len(model), MaxModelBytes)
		}
		if len(m.LoRA) > MaxLoRABytes || !utf8.ValidString(m.LoRA) {
			return fmt.Errorf("%w: models[%d].lora is %d bytes: it must be valid UTF-8 of at most %d bytes (indexd's default --max-extra-bytes; it refuses a longer one on every Lookup)",
				ErrInvalidConfig, i, len(m.LoRA), MaxLoRABytes)
		}
	}
	if err := p.identityMapper().Validate(); err != nil {
		return err
	}
	tt, lt := time.Duration(p.TokenizeTimeout), time.Duration(p.LookupTimeout)
	if tt <= 0 || lt <= 0 {
		return fmt.Errorf("%w: tokenizeTimeout (%v) and lookupTimeout (%v) must be positive", ErrInvalidConfig, tt, lt)
	}
	// Each alone first: their sum could wrap past the largest duration.
	if tt >= PrepareDataBudget || lt >= PrepareDataBudget || tt+lt >= PrepareDataBudget {
		return fmt.Errorf("%w: tokenizeTimeout (%v) + lookupTimeout (%v) must stay below the director's PrepareData budget (%v)",
			ErrInvalidConfig, tt, lt, PrepareDataBudget)
	}
	if err := p.tokenizerConfig().Validate(); err != nil {
		return err
	}
	if err := p.matcherConfig().Validate(); err != nil {
		return err
	}
	if p.SpeculativeTTL == nil || p.SpeculativeIndexLag == nil || p.IdentityCheckInterval == nil || p.MaxStaleness == nil {
		return fmt.Errorf("%w: speculativeTTL, speculativeIndexLag, identityCheckInterval and maxStaleness must not be null (leave them out for their defaults)", ErrInvalidConfig)
	}
	if *p.SpeculativeTTL < 0 || *p.SpeculativeIndexLag < 0 || *p.IdentityCheckInterval < 0 {
		return fmt.Errorf("%w: speculativeTTL, speculativeIndexLag and identityCheckInterval must not be negative", ErrInvalidConfig)
	}
	if *p.MaxStaleness < 0 {
		return fmt.Errorf("%w: maxStaleness %v must not be negative (\"0s\" turns the check off)", ErrInvalidConfig, time.Duration(*p.MaxStaleness))
	}
	if p.SpeculativeMaxEntries <= 0 {
		return fmt.Errorf("%w: speculativeMaxEntries %d must be positive (speculativeTTL \"0s\" turns the entries off)", ErrInvalidConfig, p.SpeculativeMaxEntries)
	}
	if p.Fallback != FallbackApproximate && p.Fallback != FallbackNone {
		return fmt.Errorf("%w: fallback %q: want %s or %s", ErrInvalidConfig, p.Fallback, FallbackApproximate, FallbackNone)
	}
	if p.FallbackLogInterval <= 0 {
		return fmt.Errorf("%w: fallbackLogInterval %v must be positive", ErrInvalidConfig, time.Duration(p.FallbackLogInterval))
	}
	return nil
}

func (p ProducerParams) identityMapper() IdentityMapper {
	return IdentityMapper{PodIdentity: p.PodIdentity, Ranks: p.Ranks, RankPortStride: p.RankPortStride}
}

func (p ProducerParams) tokenizerConfig() TokenizerConfig {
	return TokenizerConfig{URL: p.Tokenizer.URL, Scheme: p.Tokenizer.Scheme, Path: p.Tokenizer.Path, MaxResponseBytes: p.Tokenizer.MaxResponseBytes}
}

func (p ProducerParams) matcherConfig() MatcherConfig {
	c := MatcherConfig{BlockSize: p.BlockSize, LookupTimeout: time.Duration(p.LookupTimeout), MaxPromptTokens: p.MaxPromptTokens}
	if p.MaxStaleness != nil { // nil only in unfilled params, which Validate refuses
		c.MaxStaleness = time.Duration(*p.MaxStaleness)
	}
	return c
}

// mapModel returns the kvindex model and LoRA for a request's model.
func (p ProducerParams) mapModel(requestModel string) (model, lora string) {
	for _, m := range p.Models {
		if m.Match == requestModel {
			if m.Model == "" {
				return requestModel, m.LoRA
			}
			return m.Model, m.LoRA
		}
	}
	return requestModel, ""
}

// TierScorerParams are the parameters of kvindex-tier-scorer: the weight
// of a matched block by its tier. Defaults gpu 1.0, cpu 0.8, disk 0.5;
// each must lie in [0, 1]. Unknown fields are an error.
type TierScorerParams struct {
	GPU  *float64 `json:"gpu,omitempty"`
	CPU  *float64 `json:"cpu,omitempty"`
	Disk *float64 `json:"disk,omitempty"`
}

// TierWeights are the resolved weights.
type TierWeights struct{ GPU, CPU, Disk float64 }

// Validate returns an error wrapping ErrInvalidConfig unless every weight
// lies in [0, 1] (NaN does not).
func (w TierWeights) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"gpu", w.GPU}, {"cpu", w.CPU}, {"disk", w.Disk}} {
		if !(f.v >= 0 && f.v <= 1) {
			return fmt.Errorf("%w: tier weight %s %v outside [0, 1]", ErrInvalidConfig, f.name, f.v)
		}
	}
	return nil
}

// DefaultTierWeights are gpu 1.0, cpu 0.8, disk 0.5.
func DefaultTierWeights() TierWeights { return TierWeights{GPU: 1, CPU: 0.8, Disk: 0.5} }

// ParseTierScorerParams decodes raw strictly (nil or empty: the defaults)
// and validates.
func ParseTierScorerParams(raw json.RawMessage) (TierWeights, error) {
	w := DefaultTierWeights()
	if len(bytes.TrimSpace(raw)) == 0 {
		return w, nil
	}
	var p TierScorerParams
	if err := decodeStrict(raw, &p); err != nil {
		return w, err
	}
	for _, f := range []struct{ v, dst *float64 }{{p.GPU, &w.GPU}, {p.CPU, &w.CPU}, {p.Disk, &w.Disk}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if err := w.Validate(); err != nil {
		return DefaultTierWeights(), err
	}
	return w, nil
}

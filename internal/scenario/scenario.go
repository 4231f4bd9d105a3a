// Package scenario reads the KV-event scenario files of the fixtures
// (testdata/fixtures/scenarios/*.jsonl, format in testdata/fixtures/README.md)
// and compares Lookup answers with their expectations. The replay command,
// the e2e suite and the component tests share it, so every runner reads a
// scenario the same way.
package scenario

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/contract"
	"github.com/kvindex/kvindex/internal/keyspace"
)

// ErrMalformed is wrapped by every error about a scenario file's content.
var ErrMalformed = errors.New("scenario: malformed file")

// maxLine bounds one JSON line of a scenario file (the largest fixture line
// is about 100 KiB).
const maxLine = 16 << 20

// Scenario is one parsed scenario file.
type Scenario struct {
	// Name and Summary come from the file's first line.
	Name    string
	Summary string
	// HashMode is the first line's "hash_mode": HashModeToken for a
	// scenario whose block keys are kvindex's canonical keys (runners
	// run it on a token-mode ingester), HashModeEngine (the default when
	// absent) for engine hashes.
	HashMode string
	// Path is the file it was loaded from, when loaded from a file.
	Path string
	// Steps are the publish and lookup steps in file order.
	Steps []Step
}

// The hash modes a scenario may name (the ingester's --hash-mode values).
const (
	HashModeEngine = "engine"
	HashModeToken  = "token"
)

// Kind is the kind of a step.
type Kind uint8

// The step kinds.
const (
	// KindPublish produces one Kafka record.
	KindPublish Kind = iota + 1
	// KindLookup looks hashes up once every earlier publish is applied.
	KindLookup
)

// Step is one line of a scenario after the first.
type Step struct {
	// Line is the 1-based line number in the file.
	Line int
	// Kind says which of Publish and Lookup is set.
	Kind    Kind
	Publish *Publish
	Lookup  *Lookup
}

// Publish is a record to produce: key, headers and value as given.
type Publish struct {
	// Key is the Kafka record key (the pod identity).
	Key string
	// Headers are the record headers ("model", and optionally "seq",
	// "dp_rank", "kind", ...).
	Headers map[string]string
	// Value is the record value (a msgpack KVEventBatch, deliberately broken
	// bytes, or empty for control records).
	Value []byte
	// Describe is a note for people.
	Describe string
}

// HeaderKeys returns the header names in sorted order, for producing
// records deterministically.
func (p *Publish) HeaderKeys() []string {
	keys := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Lookup is a Lookup to run and the endpoints it must return: by Hashes,
// or (token-mode scenarios) by Tokens with BlockSize and optional LoRAName
// and CacheSalt.
type Lookup struct {
	Model  string
	Hashes []uint64
	// Tokens, when not nil, are the prompt's token ids; BlockSize is the
	// block size the caller expects, which every returned match must
	// report; LoRAName and CacheSalt are the request's extras.
	Tokens    []uint32
	BlockSize int
	LoRAName  string
	CacheSalt string
	Expect    []Match
	Describe  string
}

// Keys returns the block keys the lookup names: Hashes, or the canonical
// keys of Tokens at BlockSize (client.TokenKeys), for runners that look
// blocks up by key.
func (l *Lookup) Keys() []uint64 {
	if l.Tokens == nil {
		return l.Hashes
	}
	return client.TokenKeys(l.Prompt(), l.BlockSize)
}

// Prompt returns the token lookup's prompt (Tokens and extras).
func (l *Lookup) Prompt() client.TokenPrompt {
	return client.TokenPrompt{TokenIDs: l.Tokens, LoRAName: l.LoRAName, CacheSalt: l.CacheSalt}
}

// Check compares actual matches with the expectation (Compare) and, for a
// token lookup, also requires every match to report BlockSize.
func (l *Lookup) Check(actual []Match) []string {
	diffs := Compare(l.Expect, actual)
	if l.Tokens != nil {
		for _, m := range actual {
			if m.BlockSize != l.BlockSize {
				diffs = append(diffs, fmt.Sprintf("%s rank %d: block size %d, expected %d", m.Pod, m.DPRank, m.BlockSize, l.BlockSize))
			}
		}
	}
	return diffs
}

// Match is one endpoint's expected (or actual) share of a prefix.
type Match struct {
	Pod    string `json:"pod"`
	DPRank uint32 `json:"dp_rank"`
	Blocks int    `json:"blocks"`
	// Tiers, when non-nil in an expectation, is the best tier of each
	// matched block ("gpu", "cpu", "disk"); nil means "not checked".
	Tiers []string `json:"tiers,omitempty"`
	// BlockSize is the endpoint's block size in an actual match (what the
	// index reports); expectations leave it out.
	BlockSize int `json:"block_size,omitempty"`
}

type line struct {
	Step     string            `json:"step"`
	Name     string            `json:"name"`
	Summary  string            `json:"summary"`
	HashMode string            `json:"hash_mode"`
	Key      *string           `json:"key"`
	Headers  map[string]string `json:"headers"`
	ValueB64 *string           `json:"value_b64"`
	Describe string            `json:"describe"`
	Model    string            `json:"model"`
	Hashes   []string          `json:"hashes"`
	Tokens   []int64           `json:"tokens"`
	BlockSz  int               `json:"block_size"`
	LoRAName string            `json:"lora_name"`
	Salt     string            `json:"cache_salt"`
	Expect   []Match           `json:"expect"`
}

// Load reads and parses the scenario file at path.
func Load(path string) (*Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s.Path = path
	return s, nil
}

// Glob loads every file matching pattern, in name order. It fails when
// nothing matches.
func Glob(pattern string) ([]*Scenario, error) {
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("scenario: no file matches %q", pattern)
	}
	slices.Sort(paths)
	out := make([]*Scenario, 0, len(paths))
	for _, p := range paths {
		s, err := Load(p)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Parse reads a scenario from r. The first line must be the "scenario"
// step; every later line a "publish" or "lookup" step.
func Parse(r io.Reader) (*Scenario, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var s *Scenario
	n := 0
	for sc.Scan() {
		n++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var l line
		dec := json.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(&l); err != nil {
			return nil, fmt.Errorf("%w: line %d: %s", ErrMalformed, n, jsonProblem(err))
		}
		if s == nil {
			if l.Step != "scenario" {
				return nil, fmt.Errorf("%w: line %d: first step is %q, want \"scenario\"", ErrMalformed, n, l.Step)
			}
			switch l.HashMode {
			case "", HashModeEngine:
				l.HashMode = HashModeEngine
			case HashModeToken:
			default:
				return nil, fmt.Errorf("%w: line %d: hash_mode %q, want %q or %q", ErrMalformed, n, l.HashMode, HashModeToken, HashModeEngine)
			}
			s = &Scenario{Name: l.Name, Summary: l.Summary, HashMode: l.HashMode}
			continue
		}
		step, err := parseStep(n, &l, s.HashMode)
		if err != nil {
			return nil, err
		}
		s.Steps = append(s.Steps, step)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrMalformed, n+1, err)
	}
	if s == nil {
		return nil, fmt.Errorf("%w: empty file", ErrMalformed)
	}
	return s, nil
}

func parseStep(n int, l *line, mode string) (Step, error) {
	switch l.Step {
	case "publish":
		if l.Key == nil || l.ValueB64 == nil {
			return Step{}, fmt.Errorf("%w: line %d: publish needs key and value_b64", ErrMalformed, n)
		}
		if l.Headers[contract.HeaderModel] == "" {
			return Step{}, fmt.Errorf("%w: line %d: publish needs a model header", ErrMalformed, n)
		}
		v, err := base64.StdEncoding.DecodeString(*l.ValueB64)
		if err != nil {
			return Step{}, fmt.Errorf("%w: line %d: value_b64: %v", ErrMalformed, n, err)
		}
		return Step{Line: n, Kind: KindPublish, Publish: &Publish{Key: *l.Key, Headers: l.Headers, Value: v, Describe: l.Describe}}, nil
	case "lookup":
		if l.Model == "" {
			return Step{}, fmt.Errorf("%w: line %d: lookup needs a model", ErrMalformed, n)
		}
		hashes := make([]uint64, len(l.Hashes))
		for i, h := range l.Hashes {
			v, err := keyspace.ParseHashText(h)
			if err != nil {
				return Step{}, fmt.Errorf("%w: line %d: hash %d %q is not 64-bit hex", ErrMalformed, n, i, h)
			}
			hashes[i] = v
		}
		expect := l.Expect
		if expect == nil {
			expect = []Match{}
		}
		lk := &Lookup{Model: l.Model, Hashes: hashes, Expect: expect, Describe: l.Describe}
		if l.Tokens != nil {
			switch {
			case mode != HashModeToken:
				return Step{}, fmt.Errorf("%w: line %d: a lookup by tokens needs a scenario with \"hash_mode\": \"token\"", ErrMalformed, n)
			case len(l.Hashes) > 0:
				return Step{}, fmt.Errorf("%w: line %d: lookup names both tokens and hashes", ErrMalformed, n)
			case l.BlockSz <= 0:
				return Step{}, fmt.Errorf("%w: line %d: lookup by tokens needs a positive block_size", ErrMalformed, n)
			}
			lk.Tokens = make([]uint32, len(l.Tokens))
			for i, t := range l.Tokens {
				if t < 0 || t > 1<<32-1 {
					return Step{}, fmt.Errorf("%w: line %d: token %d (%d) is not a uint32", ErrMalformed, n, i, t)
				}
				lk.Tokens[i] = uint32(t)
			}
			lk.BlockSize, lk.LoRAName, lk.CacheSalt = l.BlockSz, l.LoRAName, l.Salt
		} else if l.BlockSz != 0 || l.LoRAName != "" || l.Salt != "" {
			return Step{}, fmt.Errorf("%w: line %d: block_size, lora_name and cache_salt go with tokens", ErrMalformed, n)
		}
		return Step{Line: n, Kind: KindLookup, Lookup: lk}, nil
	}
	return Step{}, fmt.Errorf("%w: line %d: unknown step %q", ErrMalformed, n, l.Step)
}

// Compare checks actual matches against the expected ones (order does not
// matter) and returns one human-readable line per difference; nil means
// they agree. An expectation without tiers does not check tiers; every
// actual endpoint not expected is a difference.
func Compare(expect, actual []Match) []string {
	type id struct {
		pod  string
		rank uint32
	}
	got := make(map[id]Match, len(actual))
	for _, m := range actual {
		got[id{m.Pod, m.DPRank}] = m
	}
	var diffs []string
	for _, e := range expect {
		k := id{e.Pod, e.DPRank}
		a, ok := got[k]
		delete(got, k)
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s rank %d: expected %d blocks, got none", e.Pod, e.DPRank, e.Blocks))
		case a.Blocks != e.Blocks:
			diffs = append(diffs, fmt.Sprintf("%s rank %d: expected %d blocks, got %d", e.Pod, e.DPRank, e.Blocks, a.Blocks))
		case e.Tiers != nil && !slices.Equal(e.Tiers, a.Tiers):
			diffs = append(diffs, fmt.Sprintf("%s rank %d: expected tiers [%s], got [%s]", e.Pod, e.DPRank, strings.Join(e.Tiers, " "), strings.Join(a.Tiers, " ")))
		}
	}
	extra := make([]Match, 0, len(got))
	for _, m := range got {
		extra = append(extra, m)
	}
	slices.SortFunc(extra, func(a, b Match) int {
		if c := strings.Compare(a.Pod, b.Pod); c != 0 {
			return c
		}
		return int(a.DPRank) - int(b.DPRank)
	})
	for _, m := range extra {
		diffs = append(diffs, fmt.Sprintf("%s rank %d: expected nothing, got %d blocks", m.Pod, m.DPRank, m.Blocks))
	}
	return diffs
}

// jsonProblem says what is wrong with a line that does not decode, in the
// file's terms: encoding/json names the Go type it decodes into ("Go value
// of type scenario.line"), which means nothing to the file's author.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	if te.Field == "" {
		return fmt.Sprintf("a JSON %s where a step object is wanted", te.Value)
	}
	return fmt.Sprintf("field %q is a JSON %s, want %s", te.Field, te.Value, jsonKind(te.Type))
}

// jsonKind names a Go type by the JSON it decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another JSON type"
}

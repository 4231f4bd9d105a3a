package cellmap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/kvindex/kvindex/client/internal/target"
)

// MaxFileBytes bounds a cell map file; Load and Watcher refuse a larger
// one (a ConfigMap holds at most 1 MiB).
const MaxFileBytes = 1 << 20

// Cell is one kvindex stack.
type Cell struct {
	// Name identifies the cell (1-63 of [a-z0-9-], alphanumeric at both
	// ends). Required, unique.
	Name string `json:"name"`
	// Indexd is the cell's indexd target, in any form client.New takes.
	// Required.
	Indexd string `json:"indexd"`
	// Topic is the cell's Kafka topic. Required, unique among cells that
	// share brokers.
	Topic string `json:"topic"`
	// Brokers are the cell's own Kafka seed brokers; empty means the
	// producer's (--brokers).
	Brokers []string `json:"brokers,omitempty"`
}

// Rule maps the models it matches to cells.
type Rule struct {
	// Match is an exact model name, or a glob with "*" (any run of
	// characters, "/" included) and "?" (one character). Required.
	Match string `json:"match"`
	// Cells are the cells producers write the model to: one, or K over
	// which pods are spread (PodCell). Required, no repeats.
	Cells []string `json:"cells"`
	// ReadAlso are cells routers read as well, during a move; producers
	// never write there. Optional, disjoint from Cells.
	ReadAlso []string `json:"readAlso,omitempty"`
}

// File is the document a cell map file holds (see the package doc).
type File struct {
	Cells   []Cell `json:"cells"`
	Models  []Rule `json:"models,omitempty"`
	Default string `json:"default,omitempty"`
}

// Route is how one model is served.
type Route struct {
	// Match is the rule that chose it ("" for the default cell).
	Match string
	// Write are the cells producers write the model to (one, or the K
	// cells it is spread over), in the rule's order.
	Write []string
	// Read are the cells a Lookup of the model asks: Write, then the
	// rule's ReadAlso.
	Read []string
}

// Spread reports whether the model's pods are spread over several cells.
func (r Route) Spread() bool { return len(r.Write) > 1 }

// Map is a parsed, valid cell map. It is immutable and safe for concurrent
// use.
type Map struct {
	file  File
	cells map[string]Cell
	exact map[string]*Rule
	globs []globRule
	data  []byte
}

type globRule struct {
	rule *Rule
	re   *regexp.Regexp
}

// Current returns m: a Map is its own static source (client.WithCells).
func (m *Map) Current() *Map { return m }

// File returns a copy of the document m was parsed from (Format writes it
// back).
func (m *Map) File() File {
	f := File{Default: m.file.Default}
	for _, c := range m.file.Cells {
		c.Brokers = slices.Clone(c.Brokers)
		f.Cells = append(f.Cells, c)
	}
	for _, r := range m.file.Models {
		r.Cells, r.ReadAlso = slices.Clone(r.Cells), slices.Clone(r.ReadAlso)
		f.Models = append(f.Models, r)
	}
	return f
}

// Cells returns the cells in file order.
func (m *Map) Cells() []Cell {
	out := make([]Cell, len(m.file.Cells))
	copy(out, m.file.Cells)
	return out
}

// Cell returns the cell named name.
func (m *Map) Cell(name string) (Cell, bool) {
	c, ok := m.cells[name]
	return c, ok
}

// Route returns how model is served: its exact rule, else the first
// matching glob, else the default cell. It errors with ErrNoCell when none
// applies.
func (m *Map) Route(model string) (Route, error) {
	r := m.exact[model]
	if r == nil {
		for _, g := range m.globs {
			if g.re.MatchString(model) {
				r = g.rule
				break
			}
		}
	}
	if r == nil {
		if m.file.Default == "" {
			return Route{}, fmt.Errorf("%w %q (no rule matches it and the map has no default)", ErrNoCell, model)
		}
		return Route{Write: []string{m.file.Default}, Read: []string{m.file.Default}}, nil
	}
	return Route{Match: r.Match, Write: slices.Clone(r.Cells), Read: append(slices.Clone(r.Cells), r.ReadAlso...)}, nil
}

// WriteCell returns the cell a producer writes pod's records of model to:
// the route's only write cell, or PodCell's pick among them.
func (m *Map) WriteCell(model, pod string) (Cell, error) {
	r, err := m.Route(model)
	if err != nil {
		return Cell{}, err
	}
	return m.cells[PodCell(r.Write, pod)], nil
}

// Equal reports whether m and o were parsed from the same bytes.
func (m *Map) Equal(o *Map) bool { return m != nil && o != nil && bytes.Equal(m.data, o.data) }

// PodCell picks pod's cell among cells by rendezvous (highest random
// weight) hashing: the cell whose FNV-1a hash of (cell, 0, pod) is
// largest, ties to the name first in order. Stable across processes and
// releases; removing a cell moves only its pods, adding one moves 1/K of
// them. "" for no cells.
func PodCell(cells []string, pod string) string {
	best, bestW := "", uint64(0)
	for _, c := range cells {
		h := fnv.New64a()
		h.Write([]byte(c))
		h.Write([]byte{0})
		h.Write([]byte(pod))
		if w := mix(h.Sum64()); best == "" || w > bestW {
			best, bestW = c, w
		}
	}
	return best
}

// mix is SplitMix64's finalizer: FNV's high bits alone are poorly spread
// for short, similar inputs.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Load reads and parses the cell map file at path (at most MaxFileBytes).
func Load(path string) (*Map, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cellmap: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cellmap: reading %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, path, MaxFileBytes)
	}
	return data, nil
}

// Format renders f as the indented JSON Parse reads.
func Format(f File) []byte {
	b, _ := json.MarshalIndent(f, "", "  ") // a File always marshals
	return append(b, '\n')
}

var cellName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Parse parses and validates a cell map (see the package doc). Errors wrap
// ErrInvalid and name the line.
func Parse(data []byte) (*Map, error) {
	p := parser{data: data}
	f, err := p.file()
	if err != nil {
		return nil, err
	}
	m := &Map{file: f, cells: map[string]Cell{}, exact: map[string]*Rule{}, data: bytes.Clone(data)}
	if len(f.Cells) == 0 {
		return nil, p.errAt(0, "the map names no cell (\"cells\" is empty or missing)")
	}
	topics := map[string]string{}
	for i, c := range f.Cells {
		at := p.cellPos[i]
		switch {
		case !cellName.MatchString(c.Name):
			return nil, p.errAt(at, "cell %d: name %q is not 1-63 of [a-z0-9-] starting and ending alphanumeric", i, c.Name)
		case m.cells[c.Name].Name != "":
			return nil, p.errAt(at, "cell %q is defined twice", c.Name)
		case strings.TrimSpace(c.Indexd) == "":
			return nil, p.errAt(at, "cell %q: indexd (its indexd target) is required", c.Name)
		case target.Check(c.Indexd) != nil:
			return nil, p.errAt(at, "cell %q: indexd: %v", c.Name, target.Check(c.Indexd))
		case strings.TrimSpace(c.Topic) == "" || !utf8.ValidString(c.Topic):
			return nil, p.errAt(at, "cell %q: topic is required", c.Name)
		case ValidateTopic(c.Topic) != nil:
			return nil, p.errAt(at, "cell %q: topic: %v", c.Name, ValidateTopic(c.Topic))
		}
		for _, b := range c.Brokers {
			if strings.TrimSpace(b) == "" {
				return nil, p.errAt(at, "cell %q: an empty broker", c.Name)
			}
		}
		key := strings.Join(c.Brokers, ",") + "\x00" + c.Topic
		if other, ok := topics[key]; ok {
			return nil, p.errAt(at, "cells %q and %q share topic %q on the same brokers", other, c.Name, c.Topic)
		}
		topics[key] = c.Name
		m.cells[c.Name] = c
	}
	for i := range f.Models {
		r := &m.file.Models[i]
		at := p.rulePos[i]
		if r.Match == "" || !utf8.ValidString(r.Match) {
			return nil, p.errAt(at, "model rule %d: match is required", i)
		}
		if len(r.Cells) == 0 {
			return nil, p.errAt(at, "model rule %q: cells is required", r.Match)
		}
		seen := map[string]bool{}
		for _, c := range append(slices.Clone(r.Cells), r.ReadAlso...) {
			if _, ok := m.cells[c]; !ok {
				return nil, p.errAt(at, "model rule %q: unknown cell %q", r.Match, c)
			}
			if seen[c] {
				return nil, p.errAt(at, "model rule %q: cell %q is listed twice (cells and readAlso together)", r.Match, c)
			}
			seen[c] = true
		}
		if !strings.ContainsAny(r.Match, "*?") {
			if m.exact[r.Match] != nil {
				return nil, p.errAt(at, "model %q has two rules", r.Match)
			}
			m.exact[r.Match] = r
			continue
		}
		for _, g := range m.globs {
			if g.rule.Match == r.Match {
				return nil, p.errAt(at, "glob %q has two rules", r.Match)
			}
		}
		m.globs = append(m.globs, globRule{rule: r, re: globRegexp(r.Match)})
	}
	if f.Default != "" {
		if _, ok := m.cells[f.Default]; !ok {
			return nil, p.errAt(p.defaultPos, "default names unknown cell %q", f.Default)
		}
	}
	return m, nil
}

// globRegexp compiles a glob: "*" any run, "?" one character, the rest
// literal.
func globRegexp(g string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`^`)
	for _, r := range g {
		switch r {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`$`)
	return regexp.MustCompile(b.String())
}

// parser decodes a File, remembering where each entry starts.
type parser struct {
	data                []byte
	cellPos, rulePos    []int
	defaultPos, lastPos int
}

// line is the 1-based line of byte offset off.
func (p *parser) line(off int) int {
	off = min(max(off, 0), len(p.data))
	return 1 + bytes.Count(p.data[:off], []byte{'\n'})
}

func (p *parser) errAt(off int, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrInvalid, p.line(off), fmt.Sprintf(format, args...))
}

// decodeErr turns a JSON error at base+its offset into a line error.
func (p *parser) decodeErr(base int, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return p.errAt(base+int(syn.Offset), "%v", err)
	case errors.As(err, &typ):
		return p.errAt(base+int(typ.Offset), "%v", err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return p.errAt(len(p.data), "unexpected end of the document")
	}
	return p.errAt(base, "%v", err)
}

// skip returns the offset of the first byte at or after off that is not
// JSON white space or a comma.
func (p *parser) skip(off int) int {
	for off < len(p.data) && strings.IndexByte(" \t\r\n,:", p.data[off]) >= 0 {
		off++
	}
	return off
}

func (p *parser) file() (File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(p.data))
	tok, err := dec.Token()
	if err != nil {
		return f, p.decodeErr(0, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return f, p.errAt(0, "the map must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		keyAt := p.skip(int(dec.InputOffset()))
		tok, err := dec.Token()
		if err != nil {
			return f, p.decodeErr(0, err)
		}
		key, _ := tok.(string)
		if seen[key] {
			return f, p.errAt(keyAt, "field %q given twice", key)
		}
		seen[key] = true
		switch key {
		case "cells":
			p.cellPos, err = p.array(dec, func(raw []byte, at int) error {
				var c Cell
				if err := strict(raw, &c); err != nil {
					return p.decodeErr(at, err)
				}
				f.Cells = append(f.Cells, c)
				return nil
			})
		case "models":
			p.rulePos, err = p.array(dec, func(raw []byte, at int) error {
				var r Rule
				if err := strict(raw, &r); err != nil {
					return p.decodeErr(at, err)
				}
				f.Models = append(f.Models, r)
				return nil
			})
		case "default":
			p.defaultPos = p.skip(int(dec.InputOffset()))
			if err = dec.Decode(&f.Default); err != nil {
				err = p.decodeErr(p.defaultPos, err)
			}
		default:
			return f, p.errAt(keyAt, "unknown field %q (want cells, models, default)", key)
		}
		if err != nil {
			return f, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return f, p.decodeErr(0, err)
	}
	if end := p.skip(int(dec.InputOffset())); end < len(p.data) {
		return f, p.errAt(end, "text after the map's closing brace")
	}
	return f, nil
}

// array reads a JSON array of objects, calling each with its bytes and
// start offset, and returns the offsets.
func (p *parser) array(dec *json.Decoder, each func(raw []byte, at int) error) ([]int, error) {
	at := p.skip(int(dec.InputOffset()))
	tok, err := dec.Token()
	if err != nil {
		return nil, p.decodeErr(at, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, p.errAt(at, "want an array")
	}
	var pos []int
	for dec.More() {
		at := p.skip(int(dec.InputOffset()))
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, p.decodeErr(at, err)
		}
		if err := each(raw, at); err != nil {
			return nil, err
		}
		pos = append(pos, at)
	}
	if _, err := dec.Token(); err != nil {
		return nil, p.decodeErr(at, err)
	}
	return pos, nil
}

// strict decodes raw into v, refusing unknown fields.
func strict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

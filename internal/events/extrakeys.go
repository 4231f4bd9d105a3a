package events

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/kvindex/kvindex/client"
)

// ExtraKind is the type of one extra hash key of a block, numbered as the
// canonical key's type byte: client.ExtraKind, the one definition the
// ingester, indexd and routers share (docs/hashing.md).
type ExtraKind = client.ExtraKind

// The extra key types an engine's extra_keys may hold (client's).
const (
	// ExtraString: a msgpack str (a LoRA name, a multimodal item's hash,
	// a cache salt).
	ExtraString = client.ExtraString
	// ExtraBytes: a msgpack bin.
	ExtraBytes = client.ExtraBytes
	// ExtraInt: a msgpack integer.
	ExtraInt = client.ExtraInt
)

// Extra is one extra hash key of a block, as the engine sent it in
// extra_keys, in the byte form the canonical key hashes: client.Extra
// (docs/hashing.md, "Extras"). The decoder builds it straight from the
// payload bytes; client.EventExtras builds the same from values a msgpack
// library already decoded.
type Extra = client.Extra

// maxExtraDepth bounds the nesting of a block's extra keys that is
// flattened: the block's entry (1) holding vLLM's (mm_hash, offset) tuples
// (2), with room to spare (docs/hashing.md, "From an event").
const maxExtraDepth = 4

// extraKeys decodes a BlockStored's extra_keys: nil, or one entry per block,
// each nil or an array of str, bin or int keys, nested arrays (vLLM's
// (mm_hash, offset) tuples) contributing their elements in order. A shape
// it cannot key does not make the event invalid (engine-hash mode never
// reads extra keys): it sets BadExtraKeys, and token mode skips the event.
func (d *Decoder) extraKeys(s *eventState, name string) error {
	c, err := d.r.peek()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if c == msgpcode.Nil {
		d.r.skipNil()
		return nil
	}
	if !isArray(c) {
		s.badExtra("field %s is %s, want array or nil", name, describe(c))
		return d.skip(name)
	}
	n, err := d.arrayLen(name)
	if err != nil {
		return err
	}
	s.ev.HasExtraKeys, s.ev.ExtraKeysLen = true, n
	for i := 0; i < n; i++ {
		c, err := d.r.peek()
		if err != nil {
			return fmt.Errorf("%s[%d]: %w", name, i, err)
		}
		if c == msgpcode.Nil {
			d.r.skipNil()
			continue
		}
		if !isArray(c) {
			s.badExtra("field %s[%d] is %s, want array or nil", name, i, describe(c))
			if err := d.skip(name); err != nil {
				return err
			}
			continue
		}
		keys, err := d.appendExtras(s, name, i, nil, 1)
		if err != nil {
			return err
		}
		if keys == nil {
			keys = []Extra{}
		}
		if s.ev.ExtraKeys == nil {
			// Allocated at the first block that has keys: vLLM sends
			// [None, ...] for requests without LoRA, salt or media.
			s.ev.ExtraKeys = make([][]Extra, n)
		}
		s.ev.ExtraKeys[i] = keys
	}
	return nil
}

// appendExtras appends the keys of the array at the reader (block i's entry
// or an array nested in it, at depth) to out, flattened.
func (d *Decoder) appendExtras(s *eventState, name string, i int, out []Extra, depth int) ([]Extra, error) {
	m, err := d.arrayLen(name)
	if err != nil {
		return nil, err
	}
	for j := 0; j < m; j++ {
		c, err := d.r.peek()
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", name, i, err)
		}
		switch {
		case isArray(c) && depth < maxExtraDepth:
			if out, err = d.appendExtras(s, name, i, out, depth+1); err != nil {
				return nil, err
			}
		case isStr(c), isBin(c):
			kind := ExtraString
			if isBin(c) {
				kind = ExtraBytes
			}
			b, err := d.readBytes(name)
			if err != nil {
				return nil, err
			}
			if kind == ExtraString && !utf8.Valid(b) {
				s.badExtra("field %s[%d] has a str that is not valid UTF-8", name, i)
			}
			out = append(out, Extra{Kind: kind, Data: append([]byte{}, b...)})
		case isInteger(c):
			u, _, err := d.integer()
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", name, i, err)
			}
			out = append(out, Extra{Kind: ExtraInt, Data: binary.LittleEndian.AppendUint64(make([]byte, 0, 8), u)})
		default:
			if isArray(c) {
				s.badExtra("field %s[%d] nests deeper than %d levels", name, i, maxExtraDepth)
			} else {
				s.badExtra("field %s[%d] holds %s, want str, bin, int or an array of them", name, i, describe(c))
			}
			if err := d.skip(name); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// badExtra records the first reason the event's extra keys cannot be
// keyed.
func (s *eventState) badExtra(format string, args ...any) {
	if s.ev.BadExtraKeys == "" {
		s.ev.BadExtraKeys = fmt.Sprintf(format, args...)
	}
}

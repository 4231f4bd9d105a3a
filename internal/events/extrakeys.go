package events

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ExtraKind is the type of one extra hash key of a block, numbered as the
// canonical key's type byte (docs/hashing.md).
type ExtraKind uint8

// The extra key types an engine's extra_keys may hold.
const (
	// ExtraString: a msgpack str (a LoRA name, a multimodal item's hash,
	// a cache salt).
	ExtraString ExtraKind = 1
	// ExtraBytes: a msgpack bin.
	ExtraBytes ExtraKind = 2
	// ExtraInt: a msgpack integer.
	ExtraInt ExtraKind = 3
)

// Extra is one extra hash key of a block, as the engine sent it in
// extra_keys.
type Extra struct {
	// Kind is the key's type.
	Kind ExtraKind
	// Data is the key's bytes (ExtraString, ExtraBytes); nil for ExtraInt.
	Data []byte
	// Int is the key's value (ExtraInt).
	Int int64
}

// extraKeys decodes a BlockStored's extra_keys: nil, or one entry per block,
// each nil or an array of str, bin or int keys. A shape it cannot read does
// not make the event invalid (engine-hash mode never reads extra keys): it
// sets BadExtraKeys, and token mode skips the event.
func (d *Decoder) extraKeys(s *eventState, name string) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if c == msgpcode.Nil {
		return d.dec.Skip()
	}
	bad := func(format string, args ...any) {
		if s.ev.BadExtraKeys == "" {
			s.ev.BadExtraKeys = fmt.Sprintf(format, args...)
		}
	}
	if !isArray(c) {
		bad("field %s is %s, want array or nil", name, describe(c))
		return d.skip(name)
	}
	n, err := d.arrayLen(name)
	if err != nil {
		return err
	}
	s.ev.HasExtraKeys, s.ev.ExtraKeysLen = true, n
	for i := 0; i < n; i++ {
		c, err := d.dec.PeekCode()
		if err != nil {
			return fmt.Errorf("%s[%d]: %w", name, i, err)
		}
		if c == msgpcode.Nil {
			if err := d.dec.Skip(); err != nil {
				return fmt.Errorf("%s[%d]: %w", name, i, err)
			}
			continue
		}
		if !isArray(c) {
			bad("field %s[%d] is %s, want array or nil", name, i, describe(c))
			if err := d.skip(name); err != nil {
				return err
			}
			continue
		}
		m, err := d.arrayLen(name)
		if err != nil {
			return err
		}
		keys := make([]Extra, 0, m)
		for j := 0; j < m; j++ {
			c, err := d.dec.PeekCode()
			if err != nil {
				return fmt.Errorf("%s[%d][%d]: %w", name, i, j, err)
			}
			switch {
			case isStr(c), isBin(c):
				kind := ExtraString
				if isBin(c) {
					kind = ExtraBytes
				}
				b, err := d.readBytes(name)
				if err != nil {
					return err
				}
				keys = append(keys, Extra{Kind: kind, Data: append([]byte{}, b...)})
			case isInteger(c):
				u, _, err := d.integer()
				if err != nil {
					return fmt.Errorf("%s[%d][%d]: %w", name, i, j, err)
				}
				keys = append(keys, Extra{Kind: ExtraInt, Int: int64(u)})
			default:
				bad("field %s[%d][%d] is %s, want str, bin or int", name, i, j, describe(c))
				if err := d.skip(name); err != nil {
					return err
				}
			}
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

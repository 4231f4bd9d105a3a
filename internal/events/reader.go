package events

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// reader reads msgpack values (the msgpack spec's formats, codes named by
// vmihailenco/msgpack's msgpcode) straight out of one payload held in
// memory. It is the decoder's only view of the bytes: every read checks the
// bytes it needs against what remains and fails with a "truncated" error
// rather than reading past the end, and no length header ever allocates.
// Strings and byte strings come back as slices of the payload, which
// outlives every caller's use of them (each copies what it keeps).
//
// It replaces msgpack.Decoder over a bytes.Reader on the ingest path: the
// library's decoder reads one byte at a time through an io.ByteScanner,
// about a third of the ingester's decode time (BENCHMARKS.md, "The
// decoder's reader"). The library still encodes the test payloads, and its
// codes name the formats here.
type reader struct {
	b []byte
	i int // offset of the next unread byte
}

// reset points the reader at the start of b.
func (r *reader) reset(b []byte) { r.b, r.i = b, 0 }

// len returns how many bytes remain unread.
func (r *reader) len() int { return len(r.b) - r.i }

// rest returns the unread bytes, aliasing the payload.
func (r *reader) rest() []byte { return r.b[r.i:] }

// advance skips n bytes the caller has checked are there.
func (r *reader) advance(n int) { r.i += n }

// peek returns the code of the next value without consuming it.
func (r *reader) peek() (byte, error) {
	if r.i >= len(r.b) {
		return 0, errTruncated(0, 1)
	}
	return r.b[r.i], nil
}

// next consumes n bytes and returns them, or fails when fewer remain.
func (r *reader) next(n int) ([]byte, error) {
	if n > r.len() {
		return nil, errTruncated(r.len(), n)
	}
	b := r.b[r.i : r.i+n]
	r.i += n
	return b, nil
}

// errTruncated reports a value cut short by the payload's end.
func errTruncated(have, want int) error {
	return fmt.Errorf("payload truncated: %d bytes remain, want %d", have, want)
}

// uintN reads an n-byte big-endian unsigned integer (n is 1, 2, 4 or 8).
func (r *reader) uintN(n int) (uint64, error) {
	b, err := r.next(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// skipNil consumes a nil the caller has peeked.
func (r *reader) skipNil() { r.i++ }

// integer reads any msgpack integer. Negative values come back as their
// two's-complement uint64 with neg set (an SGLang int64 hash reinterprets
// exactly so). Any other code is an error.
func (r *reader) integer() (u uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		r.i++
		return uint64(c), false, nil
	case c >= msgpcode.NegFixedNumLow:
		r.i++
		return uint64(int64(int8(c))), true, nil
	case c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		r.i++
		u, err := r.uintN(1 << (c - msgpcode.Uint8))
		return u, false, err
	case c >= msgpcode.Int8 && c <= msgpcode.Int64:
		r.i++
		u, err := r.uintN(1 << (c - msgpcode.Int8))
		if err != nil {
			return 0, false, err
		}
		var v int64
		switch c {
		case msgpcode.Int8:
			v = int64(int8(u))
		case msgpcode.Int16:
			v = int64(int16(u))
		case msgpcode.Int32:
			v = int64(int32(u))
		default:
			v = int64(u)
		}
		return uint64(v), v < 0, nil
	}
	return 0, false, fmt.Errorf("%s is not an integer", describe(c))
}

// float reads a float32 or float64 as float64; other codes are an error.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case msgpcode.Float:
		r.i++
		u, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(u))), err
	case msgpcode.Double:
		r.i++
		u, err := r.uintN(8)
		return math.Float64frombits(u), err
	}
	return 0, fmt.Errorf("%s is not a float", describe(c))
}

// arrayLen reads an array header; nil reads as 0. Any other code is an
// error. The count is as claimed: callers bound it by len.
func (r *reader) arrayLen() (int, error) {
	return r.containerLen(msgpcode.FixedArrayLow, msgpcode.FixedArrayMask, msgpcode.Array16, msgpcode.Array32, "an array")
}

// mapLen reads a map header (the number of key-value pairs); nil reads as
// 0. Any other code is an error. The count is as claimed.
func (r *reader) mapLen() (int, error) {
	return r.containerLen(msgpcode.FixedMapLow, msgpcode.FixedMapMask, msgpcode.Map16, msgpcode.Map32, "a map")
}

// containerLen reads the header of an array or a map, whose formats differ
// only in their codes: a fix form (fixLow with the count in its mask
// bits), a 16-bit and a 32-bit count. nil reads as 0; any other code is an
// error naming what was wanted, and consumes nothing.
func (r *reader) containerLen(fixLow, fixMask, code16, code32 byte, want string) (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var size int
	switch {
	case c&^fixMask == fixLow:
		r.i++
		return int(c & fixMask), nil
	case c == code16:
		size = 2
	case c == code32:
		size = 4
	case c == msgpcode.Nil:
		r.i++
		return 0, nil
	default:
		return 0, fmt.Errorf("%s is not %s", describe(c), want)
	}
	r.i++
	n, err := r.uintN(size)
	return int(n), err
}

// bytesLen reads the header of a str or bin and returns the length it
// claims; nil reads as 0. Any other code is an error.
func (r *reader) bytesLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	r.i++
	var size int
	switch {
	case msgpcode.IsFixedString(c):
		return int(c & msgpcode.FixedStrMask), nil
	case c == msgpcode.Str8 || c == msgpcode.Bin8:
		size = 1
	case c == msgpcode.Str16 || c == msgpcode.Bin16:
		size = 2
	case c == msgpcode.Str32 || c == msgpcode.Bin32:
		size = 4
	case c == msgpcode.Nil:
		return 0, nil
	default:
		r.i--
		return 0, fmt.Errorf("%s is not a string or bytes", describe(c))
	}
	n, err := r.uintN(size)
	return int(n), err
}

// bytes reads a str or bin and returns its bytes, aliasing the payload.
func (r *reader) bytes() ([]byte, error) {
	// Fast path: field names and mediums are short strings, one header
	// byte with the length in it.
	if r.i < len(r.b) {
		if c := r.b[r.i]; c&^msgpcode.FixedStrMask == msgpcode.FixedStrLow {
			if n := int(c & msgpcode.FixedStrMask); n < len(r.b)-r.i {
				b := r.b[r.i+1 : r.i+1+n]
				r.i += 1 + n
				return b, nil
			}
		}
	}
	n, err := r.bytesLen()
	if err != nil {
		return nil, err
	}
	return r.claimed(n)
}

// claimed consumes the n bytes a length header claimed, or fails naming the
// claim when fewer remain.
func (r *reader) claimed(n int) ([]byte, error) {
	if n > r.len() {
		return nil, fmt.Errorf("claims %d bytes but only %d remain", n, r.len())
	}
	return r.next(n)
}

// extLen reads the header of an extension (its type byte included) and
// returns the length of its data. Any other code is an error.
func (r *reader) extLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	r.i++
	var n int
	switch c {
	case msgpcode.FixExt1:
		n = 1
	case msgpcode.FixExt2:
		n = 2
	case msgpcode.FixExt4:
		n = 4
	case msgpcode.FixExt8:
		n = 8
	case msgpcode.FixExt16:
		n = 16
	case msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
		u, err := r.uintN(1 << (c - msgpcode.Ext8))
		if err != nil {
			return 0, err
		}
		n = int(u)
	default:
		r.i--
		return 0, fmt.Errorf("%s is not an extension", describe(c))
	}
	if _, err := r.next(1); err != nil { // the extension's type
		return 0, err
	}
	return n, nil
}

// skipScalar skips one value that is not a container: nil, a bool, a
// number, a str, a bin or an extension. A length header is checked against
// what remains before it is skipped.
func (r *reader) skipScalar() error {
	c, err := r.peek()
	if err != nil {
		return err
	}
	var n int
	switch {
	case c <= msgpcode.PosFixedNumHigh, c >= msgpcode.NegFixedNumLow,
		c == msgpcode.Nil, c == msgpcode.True, c == msgpcode.False:
		r.i++
		return nil
	case c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		_, _, err = r.integer()
		return err
	case c == msgpcode.Float || c == msgpcode.Double:
		_, err = r.float()
		return err
	case isStr(c) || isBin(c):
		n, err = r.bytesLen()
	case msgpcode.IsExt(c):
		n, err = r.extLen()
	default:
		return fmt.Errorf("%s cannot be skipped as a scalar", describe(c))
	}
	if err != nil {
		return err
	}
	_, err = r.claimed(n)
	return err
}

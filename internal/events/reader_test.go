package events

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvindex/kvindex/internal/testutil"
)

// encodeWide marshals v with the msgpack library, the reference encoder
// the reader is checked against, keeping integer widths.
func encodeWide(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	// Keep the widths asked for (int8 as int8, not the smallest form), so
	// every integer format is exercised.
	enc.UseCompactInts(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestReaderIntegers(t *testing.T) {
	tests := []struct {
		v       any
		wantU   uint64
		wantNeg bool
	}{
		{uint8(0), 0, false},
		{uint8(200), 200, false},
		{uint16(60000), 60000, false},
		{uint32(4_000_000_000), 4_000_000_000, false},
		{uint64(math.MaxUint64), math.MaxUint64, false},
		{int8(-100), uint64(math.MaxUint64 - 99), true},
		{int8(100), 100, false},
		{int16(-30000), uint64(1<<64 - 30000), true},
		{int32(-2_000_000_000), uint64(1<<64 - 2_000_000_000), true},
		{int64(math.MinInt64), 1 << 63, true},
		{int64(math.MaxInt64), math.MaxInt64, false},
	}
	for _, tc := range tests {
		for _, compact := range []bool{false, true} {
			var buf bytes.Buffer
			enc := msgpack.NewEncoder(&buf)
			enc.UseCompactInts(compact)
			if err := enc.Encode(tc.v); err != nil {
				t.Fatal(err)
			}
			var r reader
			r.reset(buf.Bytes())
			u, neg, err := r.integer()
			if err != nil || u != tc.wantU || neg != tc.wantNeg || r.len() != 0 {
				t.Errorf("%T %v (compact %v, % x): got %d, %v, %v with %d bytes left; want %d, %v", tc.v, tc.v, compact, buf.Bytes(), u, neg, err, r.len(), tc.wantU, tc.wantNeg)
			}
		}
	}
	// Fix ints, both signs.
	for _, v := range []int64{0, 1, 127, -1, -32} {
		var r reader
		r.reset(encodeWide(t, v))
		if u, neg, err := r.integer(); err != nil || int64(u) != v || neg != (v < 0) {
			t.Errorf("%d: got %d, %v, %v", v, int64(u), neg, err)
		}
	}
}

func TestReaderFloats(t *testing.T) {
	for _, v := range []any{float32(1.5), float64(1733000000.25), math.Inf(-1)} {
		var r reader
		r.reset(encodeWide(t, v))
		got, err := r.float()
		want := float64(0)
		switch v := v.(type) {
		case float32:
			want = float64(v)
		case float64:
			want = v
		}
		if err != nil || got != want || r.len() != 0 {
			t.Errorf("%v: got %v, %v with %d bytes left", v, got, err, r.len())
		}
	}
	var r reader
	r.reset(encodeWide(t, "x"))
	if _, err := r.float(); err == nil {
		t.Error("a string read as a float")
	}
}

func TestReaderStringsAndBytes(t *testing.T) {
	// Every length header: fixstr, str8, str16, str32; bin8, bin16, bin32.
	for _, n := range []int{0, 5, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("k", n)
		for _, v := range []any{s, []byte(s)} {
			var r reader
			r.reset(encodeWide(t, v))
			got, err := r.bytes()
			if err != nil || string(got) != s || r.len() != 0 {
				t.Errorf("%T of %d bytes: got %d bytes, %v with %d bytes left", v, n, len(got), err, r.len())
			}
		}
	}
}

func TestReaderContainers(t *testing.T) {
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		arr := make([]any, n)
		for i := range arr {
			arr[i] = nil
		}
		var r reader
		r.reset(encodeWide(t, arr))
		if got, err := r.arrayLen(); err != nil || got != n || r.len() != n {
			t.Errorf("array of %d: got %d, %v with %d bytes left", n, got, err, r.len())
		}
		m := make(map[int]bool, n)
		for i := range n {
			m[i] = true
		}
		r.reset(encodeWide(t, m))
		if got, err := r.mapLen(); err != nil || got != n {
			t.Errorf("map of %d: got %d, %v", n, got, err)
		}
	}
	var r reader
	r.reset([]byte{0xc0, 0xc0})
	if n, err := r.arrayLen(); err != nil || n != 0 {
		t.Errorf("nil as array: %d, %v", n, err)
	}
	if n, err := r.mapLen(); err != nil || n != 0 {
		t.Errorf("nil as map: %d, %v", n, err)
	}
	r.reset(encodeWide(t, 7))
	if _, err := r.arrayLen(); err == nil || r.len() != 1 {
		t.Errorf("an int read as an array: %v, %d bytes left", err, r.len())
	}
}

// randomValue builds a random msgpack-encodable value of bounded depth,
// covering every format the library writes, extensions included.
func randomValue(rng *rand.Rand, depth int) any {
	k := rng.IntN(14)
	if depth > 3 && k >= 11 {
		k = rng.IntN(11)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return rng.IntN(2) == 0
	case 2:
		return int64(rng.Uint64())
	case 3:
		return rng.Uint64() >> rng.IntN(64)
	case 4:
		return -int64(rng.IntN(1 << rng.IntN(40)))
	case 5:
		return rng.Float32()
	case 6:
		return rng.NormFloat64()
	case 7:
		return strings.Repeat("s", rng.IntN(300))
	case 8:
		return bytes.Repeat([]byte{0xab}, rng.IntN(70000)>>rng.IntN(9))
	case 9:
		return &testExt{Data: bytes.Repeat([]byte{1}, []int{1, 2, 4, 8, 16, 3, 300}[rng.IntN(7)])}
	case 10:
		return int8(rng.IntN(256) - 128)
	case 11, 12:
		arr := make([]any, rng.IntN(20))
		for i := range arr {
			arr[i] = randomValue(rng, depth+1)
		}
		return arr
	}
	n := rng.IntN(10)
	m := make(map[string]any, n)
	for range n {
		m[strings.Repeat("k", rng.IntN(40))] = randomValue(rng, depth+1)
	}
	return m
}

// testExt is a msgpack extension type, registered so the library encodes it
// as an ext of its data's length (fixext 1-16, ext8, ext16).
type testExt struct{ Data []byte }

func (e *testExt) MarshalMsgpack() ([]byte, error) { return e.Data, nil }

func (e *testExt) UnmarshalMsgpack(b []byte) error { e.Data = append([]byte{}, b...); return nil }

func init() { msgpack.RegisterExt(42, (*testExt)(nil)) }

// TestReaderSkipRandom checks that the decoder's skip consumes exactly one
// value, whatever the library encoded, and that every truncation of it is
// an error rather than a panic or a read past the end.
func TestReaderSkipRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 0))
	d := NewDecoder(nil)
	for i := range 300 {
		v := randomValue(rng, 0)
		b := encodeWide(t, v)
		tail := []byte{0xc3, 0x01}
		d.r.reset(append(append([]byte{}, b...), tail...))
		if err := d.skip("value"); err != nil {
			t.Fatalf("value %d (% x...): %v", i, b[:min(len(b), 16)], err)
		}
		if diff := cmp.Diff(tail, d.r.rest()); diff != "" {
			t.Fatalf("value %d: skip left (-want +got):\n%s", i, diff)
		}
		for _, cut := range []int{0, len(b) / 3, len(b) / 2, len(b) - 1} {
			if cut >= len(b) {
				continue
			}
			d.r.reset(b[:cut])
			if err := d.skip("value"); err == nil {
				t.Fatalf("value %d cut to %d of %d bytes: skip succeeded", i, cut, len(b))
			}
		}
	}
}

func TestReaderInvalidCode(t *testing.T) {
	d := NewDecoder(nil)
	d.r.reset([]byte{0xc1})
	if err := d.skip("value"); err == nil || !strings.Contains(err.Error(), "0xc1") {
		t.Errorf("skip of the never-used code 0xc1: %v", err)
	}
}

func TestArena(t *testing.T) {
	var a arena[int64]
	first := a.take(3)
	first = append(first, 1, 2, 3)
	second := a.take(2)
	second = append(second, 4, 5)
	// An append past the capacity asked for must not reach the neighbour.
	first = append(first, 99)
	if diff := cmp.Diff([]int64{4, 5}, second); diff != "" {
		t.Errorf("second slice after an append to the first (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{1, 2, 3, 99}, first); diff != "" {
		t.Errorf("first slice (-want +got):\n%s", diff)
	}
	big := a.take(arenaMax + 1)
	if cap(big) != arenaMax+1 || len(big) != 0 {
		t.Errorf("take(%d): len %d cap %d", arenaMax+1, len(big), cap(big))
	}
}

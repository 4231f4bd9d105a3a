package keyspace

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEngineHashRoundTrip(t *testing.T) {
	for _, h := range []uint64{0, 1, 0xdeadbeef, 0x0123456789abcdef, ^uint64(0)} {
		v := AppendEngineHash(nil, h)
		if len(v) != EngineHashLen {
			t.Fatalf("AppendEngineHash(%#x) = %q, want %d bytes", h, v, EngineHashLen)
		}
		got, err := ParseEngineHash(v)
		if err != nil || got != h {
			t.Fatalf("ParseEngineHash(%q) = %#x, %v; want %#x", v, got, err, h)
		}
	}
	if got := string(AppendEngineHash([]byte("x"), 0xab)); got != "x00000000000000ab" {
		t.Errorf("AppendEngineHash appends %q, want x00000000000000ab", got)
	}
}

func TestParseEngineHashRejects(t *testing.T) {
	for name, v := range map[string]string{
		"empty":     "",
		"short":     "00000000000000a",
		"long":      "00000000000000aaa",
		"uppercase": "00000000000000AB",
		"not_hex":   "00000000000000zz",
		"signed":    "-000000000000001",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseEngineHash([]byte(v)); !errors.Is(err, ErrMalformedValue) {
				t.Errorf("ParseEngineHash(%q) = %v, want ErrMalformedValue", v, err)
			}
		})
	}
}

func TestParseHashMode(t *testing.T) {
	tests := []struct {
		in      string
		want    HashMode
		wantErr bool
	}{
		{in: "token", want: HashModeToken},
		{in: "engine", want: HashModeEngine},
		{in: "", wantErr: true},
		{in: "Token", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseHashMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseHashMode(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestEndpointRecordWithoutHashModeIsEngine(t *testing.T) {
	// Records written before v1.1 carry no hash_mode: the only mode there
	// was is engine-hash mode.
	const v = `{"block_size":16,"last_record":"2026-01-01T00:00:00Z","topic":"t","partition":2,"lease":"0"}`
	r, err := UnmarshalEndpointRecord([]byte(v))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(HashModeEngine, r.HashMode); diff != "" {
		t.Errorf("record hash mode (-want +got):\n%s", diff)
	}
	if _, err := UnmarshalEndpointMeta([]byte(v)); err != nil {
		t.Errorf("UnmarshalEndpointMeta of a pre-v1.1 record: %v", err)
	}
}

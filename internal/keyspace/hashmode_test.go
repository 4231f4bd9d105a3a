package keyspace

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

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

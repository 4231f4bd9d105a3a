package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReadTrace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		limit   int
		want    []Request
		skipped int
		clamped int
		unique  int
		wantErr string
	}{
		{
			name: "two requests sharing a prefix",
			in: `{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]}
{"timestamp": 1500, "input_length": 1030, "output_length": 5, "hash_ids": [7, 8, 4]}
`,
			want: []Request{
				{At: 0, IDs: []uint64{7, 8, 9}, Keys: chainKeys([]uint64{7, 8}), LastTokens: 76},
				{At: 1500 * time.Millisecond, IDs: []uint64{7, 8, 4}, Keys: chainKeys([]uint64{7, 8}), LastTokens: 6},
			},
			unique: 2,
		},
		{
			name: "malformed lines are skipped and counted",
			in: `not json
{"timestamp": 0, "hash_ids": [1]}
{"timestamp": -1, "input_length": 10, "hash_ids": [1]}
{"timestamp": 0, "input_length": 10, "hash_ids": []}
{"timestamp": 5, "input_length": 10, "hash_ids": [1, -2]}
{"timestamp": 9, "input_length": 600, "hash_ids": [3, 4]}
{"timestamp": 8, "input_length": 600, "hash_ids": [3, 4]}
`,
			want:    []Request{{At: 9 * time.Millisecond, IDs: []uint64{3, 4}, Keys: chainKeys([]uint64{3}), LastTokens: 88}},
			skipped: 6,
			unique:  1,
		},
		{
			name:    "an input length that does not fit its blocks is clamped",
			in:      `{"timestamp": 0, "input_length": 100, "hash_ids": [1, 2, 3]}` + "\n" + `{"timestamp": 0, "input_length": 2048, "hash_ids": [1, 2]}`,
			want:    []Request{{IDs: []uint64{1, 2, 3}, Keys: chainKeys([]uint64{1, 2}), LastTokens: 1}, {IDs: []uint64{1, 2}, Keys: chainKeys([]uint64{1}), LastTokens: 511}},
			clamped: 2,
			unique:  2,
		},
		{
			name:  "limit",
			in:    `{"timestamp": 0, "input_length": 10, "hash_ids": [1]}` + "\n" + `{"timestamp": 1, "input_length": 10, "hash_ids": [2]}`,
			limit: 1,
			want:  []Request{{IDs: []uint64{1}, Keys: []uint64{}, LastTokens: 10}},
		},
		{name: "nothing usable", in: "{}\n", wantErr: "no usable request"},
		{name: "empty", in: "", wantErr: "no request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ReadTrace(strings.NewReader(tc.in), tc.limit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, tr.Requests); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			if tr.Skipped != tc.skipped || tr.Clamped != tc.clamped || tr.UniqueBlocks != tc.unique {
				t.Errorf("skipped, clamped, unique = %d, %d, %d; want %d, %d, %d", tr.Skipped, tr.Clamped, tr.UniqueBlocks, tc.skipped, tc.clamped, tc.unique)
			}
			if tc.skipped > 0 && !strings.HasPrefix(tr.FirstSkip, "line 1:") {
				t.Errorf("FirstSkip = %q, want the first bad line", tr.FirstSkip)
			}
		})
	}
}

// TestChainKeys: a key names a block with everything before it.
func TestChainKeys(t *testing.T) {
	a, b := chainKeys([]uint64{1, 2, 3}), chainKeys([]uint64{1, 2, 4})
	if a[0] != b[0] || a[1] != b[1] || a[2] == b[2] {
		t.Errorf("shared prefix keys %x, %x", a, b)
	}
	if c := chainKeys([]uint64{9, 2}); c[1] == a[1] {
		t.Error("block 2 after 9 has the key of block 2 after 1")
	}
}

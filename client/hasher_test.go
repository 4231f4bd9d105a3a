package client

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
)

// vectorFile is testdata/hashing/vllm_sha256_cbor.json.
type vectorFile struct {
	Vectors []struct {
		Name           string     `json:"name"`
		Algorithm      string     `json:"algorithm"`
		PythonHashSeed string     `json:"pythonhashseed"`
		BlockSize      int        `json:"block_size"`
		TokenIDs       []uint32   `json:"token_ids"`
		ExtraKeys      [][]string `json:"extra_keys"`
		NoneHashHex    string     `json:"none_hash_hex"`
		DigestsHex     []string   `json:"block_digests_hex"`
		EventHashes    []string   `json:"event_hashes_u64"`
	} `json:"vectors"`
}

func TestHasherVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "hashing", "vllm_sha256_cbor.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f vectorFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range f.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			if v.Algorithm != "sha256_cbor" {
				t.Fatalf("algorithm %q", v.Algorithm)
			}
			h, err := NewHasher(v.PythonHashSeed, v.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.root[:]); got != v.NoneHashHex {
				t.Fatalf("root (NONE_HASH) = %s, want %s", got, v.NoneHashHex)
			}
			extras := extrasOf(t, v.ExtraKeys)
			var digests []string
			for _, d := range h.BlockDigests(v.TokenIDs, extras) {
				digests = append(digests, hex.EncodeToString(d[:]))
			}
			if diff := gocmp.Diff(v.DigestsHex, digests); diff != "" {
				t.Fatalf("digests (-want +got):\n%s", diff)
			}
			var hashes []string
			for _, x := range h.BlockHashes(v.TokenIDs, extras) {
				hashes = append(hashes, strconv.FormatUint(x, 10))
			}
			if diff := gocmp.Diff(v.EventHashes, hashes); diff != "" {
				t.Fatalf("event hashes (-want +got):\n%s", diff)
			}
		})
	}
}

// extrasOf recovers the request's LoRA name and cache salt from a
// vector's per-block extra keys: a key on every block is the LoRA name,
// one on the first block only the cache salt.
func extrasOf(t *testing.T, keys [][]string) HashExtras {
	t.Helper()
	var e HashExtras
	if len(keys) == 0 || keys[0] == nil {
		return e
	}
	everyBlock := true
	for _, k := range keys[1:] {
		if len(k) == 0 || k[0] != keys[0][0] {
			everyBlock = false
		}
	}
	if everyBlock && len(keys) > 1 {
		e.LoRAName = keys[0][0]
	} else {
		e.CacheSalt = keys[0][0]
	}
	return e
}

func TestHasherExtrasChangeTheChain(t *testing.T) {
	h, err := NewHasher("0", 4)
	if err != nil {
		t.Fatal(err)
	}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	base := h.BlockHashes(tokens, HashExtras{})
	if len(base) != 2 {
		t.Fatalf("%d hashes for 9 tokens of block size 4, want 2 (partial block dropped)", len(base))
	}
	for _, tc := range []struct {
		name   string
		extras HashExtras
	}{
		{name: "lora", extras: HashExtras{LoRAName: "a"}},
		{name: "salt", extras: HashExtras{CacheSalt: "s"}},
		{name: "lora_and_salt", extras: HashExtras{LoRAName: "a", CacheSalt: "s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := h.BlockHashes(tokens, tc.extras)
			for i := range got {
				if got[i] == base[i] {
					t.Fatalf("block %d hash unchanged by %+v: every later block chains on the first", i, tc.extras)
				}
			}
		})
	}
	other, err := NewHasher("1", 4)
	if err != nil {
		t.Fatal(err)
	}
	if other.BlockHashes(tokens, HashExtras{})[0] == base[0] {
		t.Fatal("the seed does not change the hashes")
	}
	for _, bad := range []struct {
		seed string
		bs   int
	}{{"", 16}, {"0", 0}, {"0", -1}} {
		if _, err := NewHasher(bad.seed, bad.bs); err == nil {
			t.Errorf("NewHasher(%q, %d) accepted", bad.seed, bad.bs)
		}
	}
}

func BenchmarkHasher(b *testing.B) {
	h, _ := NewHasher("0", 16)
	tokens := make([]uint32, 16*512)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	dst := make([]uint64, 0, 512)
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = h.AppendBlockHashes(dst[:0], tokens, HashExtras{})
	}
}

// TestNewHasherRefusesBadConfig: no seed, a block size that is not
// positive, and one past MaxHasherBlockSize (whose buffer could not be
// grown) are refused with ErrInvalidHasher instead of a panic later.
func TestNewHasherRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		seed      string
		blockSize int
	}{{"", 16}, {"0", 0}, {"0", -16}, {"0", MaxHasherBlockSize + 1}, {"0", 1 << 50}} {
		if h, err := NewHasher(tc.seed, tc.blockSize); !errors.Is(err, ErrInvalidHasher) || h != nil {
			t.Errorf("NewHasher(%q, %d) = %v, %v; want nil and ErrInvalidHasher", tc.seed, tc.blockSize, h, err)
		}
	}
	if _, err := NewHasher("0", MaxHasherBlockSize); err != nil {
		t.Errorf("NewHasher at MaxHasherBlockSize: %v", err)
	}
}

package refmodel

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/kvindex/kvindex/client"
	"github.com/kvindex/kvindex/internal/events"
	"github.com/kvindex/kvindex/internal/keyspace"
	"github.com/kvindex/kvindex/internal/scenario"
)

// update rewrites the token-mode scenario files from tokenScenarios:
//
//	go test ./internal/refmodel -run TestTokenScenarioFiles -update
var update = flag.Bool("update", false, "rewrite the token-mode scenario fixtures")

const tokenDemoModel = "org/token-demo"

// scenarioWriter builds one token-mode scenario file, line by line.
type scenarioWriter struct {
	t     *testing.T
	model string
	buf   bytes.Buffer
	seq   map[string]uint64
	ts    float64
}

func newScenario(t *testing.T, name, summary string) *scenarioWriter {
	// Each scenario has a model of its own, so several can be replayed
	// into one deployment.
	model := tokenDemoModel
	if name[:3] != "t01" {
		model += "-" + name[:3]
	}
	w := &scenarioWriter{t: t, model: model, seq: map[string]uint64{}, ts: 1.7e9}
	w.line(struct {
		Step     string `json:"step"`
		Name     string `json:"name"`
		Summary  string `json:"summary"`
		HashMode string `json:"hash_mode"`
	}{"scenario", name, summary, "token"})
	return w
}

func (w *scenarioWriter) line(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	w.buf.Write(b)
	w.buf.WriteByte('\n')
}

// publish writes a batch record of evs from pod, numbered by the pod's
// seq.
func (w *scenarioWriter) publish(pod, describe string, evs ...events.Event) {
	w.ts += 0.25
	v, err := events.Encode(events.Batch{TS: w.ts, Events: evs}, events.EncodingMap)
	if err != nil {
		w.t.Fatal(err)
	}
	w.publishValue(pod, describe, w.seq[pod], v)
	w.seq[pod]++
}

// restart starts pod's engine anew: its next batch has seq 0 (and a newer
// ts, so it is not taken for a replay).
func (w *scenarioWriter) restart(pod string) { w.seq[pod] = 0 }

func (w *scenarioWriter) publishValue(pod, describe string, seq uint64, v []byte) {
	w.line(struct {
		Step     string            `json:"step"`
		Key      string            `json:"key"`
		Headers  map[string]string `json:"headers"`
		ValueB64 string            `json:"value_b64"`
		Describe string            `json:"describe"`
	}{"publish", pod, map[string]string{"model": w.model, "seq": strconv.FormatUint(seq, 10)}, base64.StdEncoding.EncodeToString(v), describe})
}

type tokenLookup struct {
	Step      string           `json:"step"`
	Describe  string           `json:"describe"`
	Model     string           `json:"model"`
	Tokens    []uint32         `json:"tokens"`
	BlockSize int              `json:"block_size"`
	LoRAName  string           `json:"lora_name,omitempty"`
	CacheSalt string           `json:"cache_salt,omitempty"`
	Expect    []scenario.Match `json:"expect"`
}

func (w *scenarioWriter) lookup(describe string, p client.TokenPrompt, expect ...scenario.Match) {
	if expect == nil {
		expect = []scenario.Match{}
	}
	w.line(tokenLookup{"lookup", describe, w.model, p.TokenIDs, demoBlockSize, p.LoRAName, p.CacheSalt, expect})
}

const demoBlockSize = 4

// prompt returns n tokens starting at from.
func prompt(n int, from uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

func ids(ts []uint32) []int64 {
	out := make([]int64, len(ts))
	for i, t := range ts {
		out[i] = int64(t)
	}
	return out
}

func tstore(hashes []uint64, parent uint64, toks []uint32, medium string) events.Event {
	ev := events.Event{Type: events.BlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0, Medium: medium}
	if toks != nil {
		ev.TokenIDs, ev.BlockSize = ids(toks), demoBlockSize
	}
	return ev
}

func tremove(hashes []uint64, medium string) events.Event {
	return events.Event{Type: events.BlockRemoved, BlockHashes: hashes, Medium: medium}
}

func match(pod string, tiers ...string) scenario.Match {
	return scenario.Match{Pod: pod, Blocks: len(tiers), Tiers: tiers}
}

// tokenScenarios are the public token-mode scenarios (DESIGN "Hashing"),
// by file name.
func tokenScenarios(t *testing.T) map[string][]byte {
	out := map[string][]byte{}
	p12 := prompt(12, 1000)

	w := newScenario(t, "t01_same_prompt_across_pods", "One prompt, hashed differently by each engine (no PYTHONHASHSEED): a token lookup matches every pod.")
	w.publish("vllm-0", "three blocks under vllm-0's engine hashes", tstore([]uint64{0x0a01, 0x0a02, 0x0a03}, 0, p12, "GPU"))
	w.publish("vllm-1", "the same tokens under vllm-1's hashes", tstore([]uint64{0x0b01, 0x0b02, 0x0b03}, 0, p12, "GPU"))
	w.publish("vllm-2", "vllm-2 holds the first two blocks, stored one event each", tstore([]uint64{0x0c01}, 0, p12[:4], "GPU"), tstore([]uint64{0x0c02}, 0x0c01, p12[4:8], "GPU"))
	w.lookup("the whole prompt", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu", "gpu"), match("vllm-1", "gpu", "gpu", "gpu"), match("vllm-2", "gpu", "gpu"))
	w.lookup("a longer prompt: the partial fourth block is not keyed", client.TokenPrompt{TokenIDs: append(prompt(12, 1000), 7, 8)}, match("vllm-0", "gpu", "gpu", "gpu"), match("vllm-1", "gpu", "gpu", "gpu"), match("vllm-2", "gpu", "gpu"))
	w.lookup("another prompt", client.TokenPrompt{TokenIDs: prompt(8, 1)})
	out["t01_same_prompt_across_pods.jsonl"] = w.buf.Bytes()

	w = newScenario(t, "t02_cpu_placeholders", "Offload placeholders (no tokens) take the key their engine hash has; an entry lives while any tier holds its block.")
	w.publish("vllm-0", "three blocks on gpu", tstore([]uint64{0x11, 0x12, 0x13}, 0, p12, "GPU"))
	w.publish("vllm-0", "the first two offloaded to cpu as placeholders", tstore([]uint64{0x11, 0x12}, 0, nil, "CPU"))
	w.lookup("gpu is the best tier", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu", "gpu"))
	w.publish("vllm-0", "gpu evicts all three", tremove([]uint64{0x11, 0x12, 0x13}, "GPU"))
	w.lookup("the cpu copies remain", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "cpu", "cpu"))
	w.publish("vllm-0", "back to gpu from cpu: a placeholder of a block only cpu holds", tstore([]uint64{0x11}, 0, nil, "GPU"))
	w.lookup("block 0 on gpu again", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "cpu"))
	out["t02_cpu_placeholders.jsonl"] = w.buf.Bytes()

	w = newScenario(t, "t03_orphans_and_unknown_placeholders", "Stores whose parent is unknown and placeholders of unknown engine hashes cannot be keyed: skipped, never guessed; removals of unknown hashes are no-ops.")
	w.publish("vllm-0", "block 0", tstore([]uint64{0x21}, 0, p12[:4], "GPU"))
	w.publish("vllm-0", "an orphan: blocks 1-2 chained on a parent the endpoint never stored", tstore([]uint64{0x22, 0x23}, 0x99, p12[4:], "GPU"))
	w.publish("vllm-0", "a placeholder of an unknown hash, a removal of another", tstore([]uint64{0x77}, 0, nil, "CPU"), tremove([]uint64{0x78}, "GPU"))
	w.lookup("only block 0 is keyed", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu"))
	w.publish("vllm-0", "blocks 1-2 again, chained on block 0", tstore([]uint64{0x22, 0x23}, 0x21, p12[4:], "GPU"))
	w.lookup("the whole prompt now", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu", "gpu"))
	out["t03_orphans_and_unknown_placeholders.jsonl"] = w.buf.Bytes()

	w = newScenario(t, "t04_lora_and_salt", "A LoRA name is an extra of every block, a cache salt of block 0 (from extra_keys, or lora_name when an engine sends no extra_keys).")
	lora := tstore([]uint64{0x31, 0x32}, 0, p12[:8], "GPU")
	lora.LoraName = "sql-lora"
	w.publish("vllm-0", "a LoRA request, lora_name only", lora)
	salted := tstore([]uint64{0x41, 0x42}, 0, p12[:8], "GPU")
	salted.LoraName = "sql-lora"
	salted.HasExtraKeys, salted.ExtraKeysLen = true, 2
	str := func(s string) events.Extra { return events.Extra{Kind: events.ExtraString, Data: []byte(s)} }
	salted.ExtraKeys = [][]events.Extra{{str("sql-lora"), str("tenant-7")}, {str("sql-lora")}}
	w.publish("vllm-1", "the LoRA request with cache_salt tenant-7, in extra_keys", salted)
	w.publish("vllm-2", "the base model", tstore([]uint64{0x51, 0x52}, 0, p12[:8], "GPU"))
	w.lookup("with the LoRA", client.TokenPrompt{TokenIDs: p12[:8], LoRAName: "sql-lora"}, match("vllm-0", "gpu", "gpu"))
	w.lookup("with the LoRA and the salt", client.TokenPrompt{TokenIDs: p12[:8], LoRAName: "sql-lora", CacheSalt: "tenant-7"}, match("vllm-1", "gpu", "gpu"))
	w.lookup("the base model", client.TokenPrompt{TokenIDs: p12[:8]}, match("vllm-2", "gpu", "gpu"))
	w.lookup("another salt", client.TokenPrompt{TokenIDs: p12[:8], LoRAName: "sql-lora", CacheSalt: "tenant-8"})
	out["t04_lora_and_salt.jsonl"] = w.buf.Bytes()

	w = newScenario(t, "t05_engine_restart_new_hashes", "An engine restart (seq back to 0) drops the endpoint's blocks and map; the new process hashes the same prompt anew and still matches.")
	w.publish("vllm-0", "the prompt under the first process's hashes", tstore([]uint64{0x61, 0x62, 0x63}, 0, p12, "GPU"))
	w.lookup("three blocks", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu", "gpu"))
	w.restart("vllm-0")
	w.publish("vllm-0", "a new process: seq 0 again, two blocks under new hashes", tstore([]uint64{0x71, 0x72}, 0, p12[:8], "GPU"))
	w.lookup("the new process's two blocks", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu"))
	w.publish("vllm-0", "removals of the old process's hashes are unknown: no-ops", tremove([]uint64{0x61, 0x62}, "GPU"))
	w.lookup("still two blocks", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu"))
	w.publish("vllm-0", "a placeholder of an old hash cannot be keyed", tstore([]uint64{0x63}, 0, nil, "CPU"))
	w.lookup("still two gpu blocks", client.TokenPrompt{TokenIDs: p12}, match("vllm-0", "gpu", "gpu"))
	out["t05_engine_restart_new_hashes.jsonl"] = w.buf.Bytes()
	return out
}

// TestTokenScenarioFiles checks the committed token-mode scenarios against
// their generator, and their expectations against the model in token mode.
func TestTokenScenarioFiles(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "testdata", "fixtures", "scenarios")
	for name, content := range tokenScenarios(t) {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			if *update {
				if err := os.WriteFile(path, content, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, content) {
				t.Fatalf("%s differs from its generator; run with -update", path)
			}
			s, err := scenario.Parse(bytes.NewReader(content))
			if err != nil {
				t.Fatal(err)
			}
			m := New(Config{HashMode: keyspace.HashModeToken})
			lookups := 0
			for _, st := range s.Steps {
				switch st.Kind {
				case scenario.KindPublish:
					if r := m.Apply(Record{Key: st.Publish.Key, Headers: st.Publish.Headers, Value: st.Publish.Value}); r != Applied {
						t.Errorf("line %d skipped: %s", st.Line, r)
					}
				case scenario.KindLookup:
					lookups++
					if diffs := scenario.Compare(st.Lookup.Expect, m.Lookup(st.Lookup.Model, st.Lookup.Keys())); diffs != nil {
						t.Errorf("line %d (%s): %v", st.Line, st.Lookup.Describe, diffs)
					}
				}
			}
			if lookups == 0 {
				t.Error("no lookup step")
			}
		})
	}
}

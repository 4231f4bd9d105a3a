package cellmap

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const example = `{
  "cells": [
    {"name": "a", "indexd": "127.0.0.1:1", "topic": "kv-a"},
    {"name": "b", "indexd": "127.0.0.1:2", "topic": "kv-b"},
    {"name": "c", "indexd": "127.0.0.1:3", "topic": "kv-c", "brokers": ["k:9092"]}
  ],
  "models": [
    {"match": "big", "cells": ["a", "b"]},
    {"match": "team/*", "cells": ["c"]},
    {"match": "team/special", "cells": ["b"], "readAlso": ["c"]},
    {"match": "m?", "cells": ["b"]}
  ],
  "default": "a"
}
`

func TestRoute(t *testing.T) {
	m, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, model string
		want        Route
	}{
		{"exact_spread", "big", Route{Match: "big", Write: []string{"a", "b"}, Read: []string{"a", "b"}}},
		{"glob_with_slash", "team/x/y", Route{Match: "team/*", Write: []string{"c"}, Read: []string{"c"}}},
		{"exact_beats_glob", "team/special", Route{Match: "team/special", Write: []string{"b"}, Read: []string{"b", "c"}}},
		{"question_mark", "m1", Route{Match: "m?", Write: []string{"b"}, Read: []string{"b"}}},
		{"question_mark_is_one_char", "m12", Route{Write: []string{"a"}, Read: []string{"a"}}},
		{"default", "other", Route{Write: []string{"a"}, Read: []string{"a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Route(tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Route(%q) (-want +got):\n%s", tt.model, diff)
			}
		})
	}
}

func TestNoDefault(t *testing.T) {
	m, err := Parse([]byte(`{"cells": [{"name": "a", "indexd": "x:1", "topic": "t"}], "models": [{"match": "m", "cells": ["a"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Route("other"); !errors.Is(err, ErrNoCell) {
		t.Fatalf("Route of an unmapped model: %v, want ErrNoCell", err)
	}
	if _, err := m.WriteCell("other", "p"); !errors.Is(err, ErrNoCell) {
		t.Fatalf("WriteCell of an unmapped model: %v, want ErrNoCell", err)
	}
}

func TestParseErrors(t *testing.T) {
	cell := `{"name": "a", "indexd": "x:1", "topic": "t"}`
	tests := []struct {
		name, doc string
		line      int
		want      string
	}{
		{"syntax", "{\n\"cells\": [\n{\"name\": \"a\",,}]}", 3, "invalid character"},
		{"not_object", "[]", 1, "must be a JSON object"},
		{"unknown_top_field", "{\n  \"cells\": [" + cell + "],\n  \"cels\": []}", 3, `unknown field "cels"`},
		{"unknown_cell_field", "{\"cells\": [\n" + cell + ",\n{\"name\": \"b\", \"indexd\": \"x\", \"topic\": \"u\", \"tpoic\": 1}]}", 3, `unknown field "tpoic"`},
		{"wrong_type", "{\"cells\": [\n{\"name\": 5}]}", 2, "cannot unmarshal"},
		{"no_cells", "{\"cells\": []}", 1, "names no cell"},
		{"bad_name", "{\"cells\": [\n{\"name\": \"A_1\", \"indexd\": \"x\", \"topic\": \"t\"}]}", 2, "is not 1-63"},
		{"duplicate_cell", "{\"cells\": [\n" + cell + ",\n" + strings.Replace(cell, `"t"`, `"u"`, 1) + "]}", 3, "defined twice"},
		{"no_indexd", "{\"cells\": [\n{\"name\": \"a\", \"topic\": \"t\"}]}", 2, "indexd"},
		{"no_topic", "{\"cells\": [\n{\"name\": \"a\", \"indexd\": \"x\"}]}", 2, "topic is required"},
		// A topic Kafka refuses, as --topic refuses it (before: accepted).
		{"bad_topic", "{\"cells\": [\n{\"name\": \"a\", \"indexd\": \"x\", \"topic\": \"bad topic\"}]}", 2, `cell "a": topic: topic name "bad topic" has ' ' at byte 3`},
		{"indexd_url", "{\"cells\": [\n{\"name\": \"a\", \"indexd\": \"http://x:1\", \"topic\": \"t\"}]}", 2, `cell "a": indexd: target "http://x:1" is a URL`},
		{"indexd_list_without_port", "{\"cells\": [\n{\"name\": \"a\", \"indexd\": \"a:1,b\", \"topic\": \"t\"}]}", 2, `"b" is not host:port`},
		{"indexd_list_of_nothing", "{\"cells\": [\n{\"name\": \"a\", \"indexd\": \",\", \"topic\": \"t\"}]}", 2, "names no address"},
		{"shared_topic", "{\"cells\": [\n" + cell + ",\n" + strings.Replace(cell, `"a"`, `"b"`, 1) + "]}", 3, "share topic"},
		{"unknown_cell_in_rule", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"m\", \"cells\": [\"a\"]},\n{\"match\": \"n\", \"cells\": [\"z\"]}]}", 4, `unknown cell "z"`},
		{"cell_twice", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"m\", \"cells\": [\"a\"], \"readAlso\": [\"a\"]}]}", 3, "listed twice"},
		{"empty_match", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"\", \"cells\": [\"a\"]}]}", 3, "match is required"},
		{"empty_rule_cells", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"m\", \"cells\": []}]}", 3, "cells is required"},
		{"duplicate_exact", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"m\", \"cells\": [\"a\"]},\n{\"match\": \"m\", \"cells\": [\"a\"]}]}", 4, "two rules"},
		{"duplicate_glob", "{\"cells\": [" + cell + "],\n\"models\": [\n{\"match\": \"m*\", \"cells\": [\"a\"]},\n{\"match\": \"m*\", \"cells\": [\"a\"]}]}", 4, "two rules"},
		{"bad_default", "{\"cells\": [" + cell + "],\n\n\"default\": \"b\"}", 3, `unknown cell "b"`},
		{"duplicate_field", "{\"cells\": [" + cell + "],\n\"cells\": []}", 2, "given twice"},
		{"trailing_text", "{\"cells\": [" + cell + "]}\n{}", 2, "after the map"},
		{"truncated", "{\"cells\": [" + cell, 1, "end of the document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid", err)
			}
			if want := fmt.Sprintf("line %d: ", tt.line); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse: %q, want %q and %q", err, want, tt.want)
			}
		})
	}
}

func TestFormatRoundTrip(t *testing.T) {
	m, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(Format(m.File()))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m.File(), again.File()); diff != "" {
		t.Errorf("Format then Parse (-want +got):\n%s", diff)
	}
}

func TestPodCell(t *testing.T) {
	two, three := []string{"a", "b"}, []string{"a", "b", "c"}
	counts := map[string]int{}
	moved := 0
	const pods = 3000
	for i := range pods {
		pod := fmt.Sprintf("default/vllm-%d", i)
		c2 := PodCell(two, pod)
		if again := PodCell([]string{"b", "a"}, pod); again != c2 {
			t.Fatalf("pod %s: %s with cells [a b], %s with [b a]: the pick must not depend on order", pod, c2, again)
		}
		c3 := PodCell(three, pod)
		counts[c3]++
		if c3 != c2 {
			moved++
			if c3 != "c" {
				t.Fatalf("pod %s moved from %s to %s when c was added: only moves to the new cell are allowed", pod, c2, c3)
			}
		}
	}
	// Rendezvous hashing spreads evenly: each of 3 cells within 10% of a third.
	for c, n := range counts {
		if n < pods/3*9/10 || n > pods/3*11/10 {
			t.Errorf("cell %s got %d of %d pods, want about %d", c, n, pods, pods/3)
		}
	}
	if moved < pods/3*9/10 || moved > pods/3*11/10 {
		t.Errorf("adding a third cell moved %d of %d pods, want about a third", moved, pods)
	}
	if PodCell(nil, "p") != "" {
		t.Error("PodCell of no cells is not empty")
	}
}

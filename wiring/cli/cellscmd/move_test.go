package cellscmd

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvindex/kvindex/client/cellmap"
)

const doc = `{"cells": [{"name": "a", "indexd": "x:1", "topic": "ta"}, {"name": "b", "indexd": "x:2", "topic": "tb"}, {"name": "c", "indexd": "x:3", "topic": "tc"}],
 "models": [{"match": "m", "cells": ["a"]}, {"match": "g*", "cells": ["a", "b"]}], "default": "a"}`

func TestMoveSteps(t *testing.T) {
	m, err := cellmap.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f := m.File()
	steps := []struct {
		step string
		want cellmap.Rule
	}{
		{StepBoth, cellmap.Rule{Match: "m", Cells: []string{"a"}, ReadAlso: []string{"c"}}},
		{StepFlip, cellmap.Rule{Match: "m", Cells: []string{"c"}, ReadAlso: []string{"a"}}},
		{StepFinish, cellmap.Rule{Match: "m", Cells: []string{"c"}}},
	}
	for _, s := range steps {
		if f, err = Move(f, "m", "c", s.step); err != nil {
			t.Fatalf("step %s: %v", s.step, err)
		}
		if diff := cmp.Diff(s.want, f.Models[0]); diff != "" {
			t.Fatalf("after step %s (-want +got):\n%s", s.step, diff)
		}
	}
	// A model matched by a glob gets an exact rule of its own, first.
	g, err := Move(m.File(), "gx", "c", StepBoth)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cellmap.Rule{Match: "gx", Cells: []string{"a", "b"}, ReadAlso: []string{"c"}}, g.Models[0]); diff != "" {
		t.Fatalf("glob-matched model (-want +got):\n%s", diff)
	}
}

func TestMoveRefusesStepsOutOfOrder(t *testing.T) {
	m, err := cellmap.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ model, to, step string }{
		"flip_before_both":   {"m", "c", StepFlip},
		"finish_before_flip": {"m", "c", StepFinish},
		"already_there":      {"m", "a", StepBoth},
		"within_spread":      {"gx", "b", StepBoth},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Move(m.File(), tc.model, tc.to, tc.step); !errors.Is(err, ErrStep) {
				t.Fatalf("Move: %v, want ErrStep", err)
			}
		})
	}
	if _, err := Move(m.File(), "m", "nosuch", StepBoth); err == nil {
		t.Fatal("Move to an unknown cell: no error")
	}
	if _, err := Move(m.File(), "m", "c", "jump"); err == nil {
		t.Fatal("Move with an unknown step: no error")
	}
}
